"""GPU weight sync without files: vLLM's NCCL weight-transfer engine, packed buckets.

On a GPU machine the trainer holds the weights in GPU memory and vLLM's workers hold
theirs; writing safetensors in between wastes seconds per update on a real model.
This path uses vLLM's own engine (``vllm.distributed.weight_transfer``): the trainer
opens an NCCL group with the inference workers once (rank 0 = trainer, workers after
it), and each update broadcasts every parameter in packed buckets while the workers
receive and load them, inside the same pause / checkpoint / resume protocol as the
file path (:class:`~agentrl.rollout.controller.RolloutController`).

Requirements: CUDA, the trainer's model on a GPU, and the vLLM engine started with
``InferenceConfig(weight_transfer="nccl")``. Without CUDA, :func:`nccl_available` is
False and nothing here is used; the test of this module skips cleanly.

Status: written against vLLM 0.32's API; its test runs only where a GPU is lent (it
has not run on the CPU-only development machines).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from agentrl.errors import WeightSyncError
from agentrl.runtime.net import free_port


def nccl_available() -> bool:
    """Whether this machine can use the NCCL path (CUDA present)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return bool(torch.cuda.is_available())


class EngineSyncClient:
    """vLLM's weight-sync control plane for an in-process ``AsyncLLM``.

    vLLM's trainer engine calls these four methods synchronously, from the trainer's
    thread (and from a helper thread it starts); each hops onto the event loop that
    owns the engine and waits for the result.
    """

    def __init__(self, engine: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self.loop = loop

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        self._run(
            self.engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info))
        )

    def start_weight_update(self) -> None:
        self._run(self.engine.start_weight_update())

    def update_weights(self, update_info: Any) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        self._run(self.engine.update_weights(WeightTransferUpdateRequest(update_info=update_info)))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._run(self.engine.finish_weight_update(weight_version))

    def shutdown_weight_transfer_engine(self) -> None:
        self._run(self.engine.shutdown_weight_transfer_engine())


@dataclasses.dataclass(frozen=True, slots=True)
class NCCLSendStats:
    bytes: int
    seconds: float


class NCCLWeightSender:
    """The trainer's end of the NCCL group; :meth:`send` pushes every parameter.

    Args:
        model: the trainer's (GPU) model; its ``named_parameters`` are sent.
        control: a vLLM weight-sync client (:class:`EngineSyncClient` in-process, or
            ``vllm.distributed.weight_transfer.clients.HTTPVLLMWeightSyncClient``
            for ``vllm serve`` started with ``--weight-transfer-config``).
        workers: inference worker ranks (tensor parallel size times data parallel).
        packed_buffer_mb: bucket size of the packed broadcast.
    """

    def __init__(
        self,
        model: Any,
        control: Any,
        *,
        workers: int = 1,
        packed_buffer_mb: int = 1024,
        master_port: int | None = None,
    ) -> None:
        if not nccl_available():
            raise WeightSyncError(
                "the NCCL weight path needs CUDA; on this machine publish through files "
                "(WeightPublisher's default)"
            )
        self.model = model
        self.control = control
        self.workers = workers
        self.packed_buffer_bytes = packed_buffer_mb * 2**20
        self.master_port = master_port
        self._engine: Any = None

    @classmethod
    def for_engine(cls, model: Any, client: Any, **kwargs: Any) -> NCCLWeightSender:
        """A sender to an in-process :class:`~agentrl.inference.engine.VLLMEngineClient`
        (call on its event loop)."""
        control = EngineSyncClient(client._engine, asyncio.get_running_loop())
        return cls(model, control, **kwargs)

    def connect(self) -> None:
        """Open the NCCL group with the workers (blocking; call from the trainer thread)."""
        from vllm.distributed.weight_transfer.base import ModuleSource
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        info = NCCLTrainerInitInfo(
            master_address="127.0.0.1",
            master_port=self.master_port or free_port(),
            world_size=1 + self.workers,
            packed=True,
            packed_buffer_size_bytes=self.packed_buffer_bytes,
        )
        try:
            self._engine = WeightTransferTrainerFactory.trainer_init(
                info, client=self.control, source=ModuleSource(self.model)
            )
        except Exception as e:
            raise WeightSyncError(f"opening the NCCL weight-transfer group failed: {e}") from e

    def send(self) -> NCCLSendStats:
        """Broadcast every parameter to the workers (blocking); they load them as they arrive."""
        if self._engine is None:
            self.connect()
        t0 = time.perf_counter()
        try:
            self._engine.send_weights()
        except Exception as e:
            raise WeightSyncError(f"NCCL weight broadcast failed: {e}") from e
        nbytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        return NCCLSendStats(nbytes, time.perf_counter() - t0)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None

"""``WeightPublisher``: the trainer's weights into vLLM as the next policy version.

Full weights: the model's state dict as one safetensors file in a RAM-backed folder
(``/dev/shm`` when there is one), then the rollout controller's weight-update
protocol (pause, checkpoint, ``reload_weights``, resume). Works for the in-process
engine and for ``vllm serve`` on the same machine (the server reads the folder).

LoRA: only the adapter is saved (``adapter_model.safetensors`` plus its config) and
loaded with ``load_lora_adapter``; the base weights never move. Each publish reports
the bytes that moved.

NCCL (GPU): with a :class:`~agentrl.trainer.nccl.NCCLWeightSender`, nothing is written;
the parameters are broadcast to vLLM's workers in packed buckets inside the same
protocol.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from agentrl.protocols import UpdateStats, WeightSync
from agentrl.trainer.tied import untied
from agentrl.trainer.trainer import Trainer


@dataclasses.dataclass(frozen=True, slots=True)
class PublishStats:
    version: int
    kind: str
    bytes: int
    """Bytes written and loaded: the whole model, or only the adapter."""
    save_s: float
    update: UpdateStats

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["update"] = self.update.as_dict()
        return out


def ram_dir(prefix: str = "agentrl-weights-") -> Path:
    """A fresh folder in RAM when the machine has /dev/shm, else in the temp dir."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


class WeightPublisher:
    """Publishes a :class:`Trainer`'s weights through a :class:`RolloutController`.

    Args:
        keep: how many published versions stay on disk (the engine may still read the
            newest; older ones are removed).
    """

    def __init__(
        self,
        trainer: Trainer,
        controller: WeightSync,
        directory: Path | None = None,
        keep: int = 2,
        sender: Any = None,
    ) -> None:
        self.trainer = trainer
        self.controller = controller
        self.directory = Path(directory) if directory is not None else ram_dir()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep = max(keep, 1)
        self.sender = sender
        """An NCCLWeightSender: push over NCCL instead of writing files (GPU)."""
        self._published: list[Path] = []

    async def publish(self, version: int | None = None) -> PublishStats:
        """Save the weights (in a worker thread) and run the update protocol.

        ``version``: the label to publish under (default: the engine's next one); a
        resumed run re-publishes its restored weights under their old version.
        """
        if self.sender is not None:
            sent: list[Any] = []
            update = await self.controller.update_weights(
                push=lambda: sent.append(self.sender.send()), version=version
            )
            self.trainer.set_version(update.version)
            return PublishStats(
                update.version,
                "nccl",
                sent[0].bytes if sent else 0,
                sent[0].seconds if sent else 0.0,
                update,
            )
        t0 = time.perf_counter()
        label = self.trainer.version + 1 if version is None else version
        target = self.directory / f"v{label}-step{self.trainer.step}"
        nbytes = await asyncio.to_thread(self._save, target)
        save_s = time.perf_counter() - t0
        if self.trainer.is_lora:
            update = await self.controller.update_weights(lora_dir=str(target), version=version)
        else:
            update = await self.controller.update_weights(str(target), version=version)
        self.trainer.set_version(update.version)
        self._published.append(target)
        while len(self._published) > self.keep:
            shutil.rmtree(self._published.pop(0), ignore_errors=True)
        kind = "lora" if self.trainer.is_lora else "full"
        return PublishStats(update.version, kind, nbytes, save_s, update)

    def _save(self, target: Path) -> int:
        from safetensors.torch import save_file

        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        if self.trainer.is_lora:
            self.trainer.save_adapter(tmp)  # adapter_model.safetensors + adapter_config.json
        else:
            state = untied({k: v.contiguous() for k, v in self.trainer.full_state_dict().items()})
            save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
        os.replace(tmp, target)
        return sum(f.stat().st_size for f in target.iterdir() if f.is_file())

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

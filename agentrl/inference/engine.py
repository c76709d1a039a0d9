"""In-process vLLM: :class:`VLLMEngineClient` drives an ``AsyncLLM`` in this process.

The embedded default. vLLM's engine core runs in its own processes; this client lives
on the caller's event loop, streams sampled tokens with their logprobs as deltas (every
:data:`STREAM_INTERVAL` tokens), and keeps the partial output of every running request
so an abort hands it back.

Per-token versions come from vLLM itself: the client labels the engine's weights
with ``update_weight_version`` on every reload, and vLLM reports which output tokens
each label sampled (``CompletionOutput.weight_versions``).

Not here: text rendering, env logic, the pause/checkpoint/resume protocol (that is
``rollout``'s ``RolloutController``, which calls :meth:`abort` and the reload methods).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.errors import EngineError, EngineStartupError, WeightSyncError
from agentrl.inference.base import (
    STREAM_INTERVAL,
    Generation,
    InferenceConfig,
    SamplingConfig,
    clamp_max_tokens,
    token_list,
)
from agentrl.inference.client_base import VLLMClientBase
from agentrl.inference.quiet import engine_stderr
from agentrl.models import resolve_model
from agentrl.runtime import cores
from agentrl.runtime.stopping import ensure_reaper

if TYPE_CHECKING:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

logger = logging.getLogger(__name__)

ENGINE_EXIT_TIMEOUT_S = 20.0
"""How long :meth:`VLLMEngineClient.close` lets vLLM's engine core process exit on its
own before vLLM kills it. vLLM's default is 5 s, and the engine core's own teardown
(waiting up to 5 s for its worker, then unlinking the shared memory of its message
queue, then its interpreter's exit) takes about that long on an idle 2-core machine: on
a busy one it was killed part way, and the multiprocessing resource tracker then printed
"leaked shared_memory objects" after the command's results (6-7 s with two busy loops
beside it). An engine core that hangs is still killed, after this long: within
``run.stop_grace_s`` (25 s), so a run stopped by SIGTERM still closes cleanly."""


class VLLMEngineClient(VLLMClientBase):
    """An :class:`~agentrl.inference.base.InferenceClient` over an in-process ``AsyncLLM``.

    Create with :meth:`start`; use as an async context manager or call :meth:`close`.
    Version, abort and the update sequence come from
    :class:`~agentrl.inference.client_base.VLLMClientBase`.
    """

    def __init__(
        self,
        engine: AsyncLLM,
        config: InferenceConfig,
        model_path: str,
        max_lora_rank: int | None = None,
    ) -> None:
        super().__init__(config)
        self._engine = engine
        self.model_path = model_path
        self.max_lora_rank = max_lora_rank
        """The adapter rank LoRA updates may have; None: started without LoRA."""
        self._cores_claim: int | None = None
        """This process keeps off the cores of this engine's worker (agentrl.runtime.cores)."""
        self._lora: Any = None  # vllm.lora.request.LoRARequest of the served adapter
        self._lora_ids = 0

    @classmethod
    async def start(
        cls,
        model: str,
        config: InferenceConfig | None = None,
        *,
        seed: int | None = None,
        max_lora_rank: int | None = None,
        version: int = 0,
        log_dir: Path | None = None,
    ) -> VLLMEngineClient:
        """Start an engine for ``model`` ('tiny', a model folder or a hub name).

        ``seed``: the sampler's seed (``run.seed``; None: vLLM's default).
        ``max_lora_rank``: serve LoRA adapters up to this rank (None: no LoRA).
        ``version``: the policy version the loaded weights are (a replay of a trained
        run's checkpoint labels its tokens with that checkpoint's version).
        ``log_dir``: while vLLM's logger is quiet (``agentrl`` without ``-v``), what the
        engine's processes print goes to ``log_dir/vllm-engine.log`` instead of this
        process's stderr (:mod:`agentrl.inference.quiet`).

        Raises:
            ModelNotFoundError: the model spec is not a model.
            EngineStartupError: vLLM did not start within ``startup_timeout_s``.
        """
        config = config or InferenceConfig()
        model_path = resolve_model(model)
        ensure_reaper()  # vLLM's engine process must not outlive this one (even on SIGKILL)
        os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
        with engine_stderr(log_dir) as log:
            args = _engine_args(model_path, config, seed, max_lora_rank)
            engine = await _build(args, config, model_path, log)
        # Keep the engine out of this frame's locals: vLLM's AsyncLLM.__del__ fails at
        # interpreter exit, so close() must be able to drop the last reference.
        client, engine = cls(engine, config, model_path, max_lora_rank), None
        client._version = version
        await client._engine.update_weight_version(str(version))
        from vllm.platforms import current_platform

        tied = getattr(client._engine.model_config.hf_config, "tie_word_embeddings", False)
        if tied and current_platform.is_cpu():
            logger.warning(
                "%s ties its input and output embeddings: vLLM's reload_weights on CPU "
                "keeps the old LM head, so full-weight updates are only partly applied; "
                "train with LoRA or untie the embeddings",
                model_path,
            )
        if config.keep_off_worker_cores:  # last: nothing after it can fail and leave it held
            client._cores_claim = cores.keep_off(cores.worker_cores())
        return client

    async def generate(
        self, prompt_token_ids: Sequence[int], sampling: SamplingConfig, request_id: str
    ) -> Generation:
        from vllm import SamplingParams
        from vllm.inputs.engine import tokens_input
        from vllm.sampling_params import RequestOutputKind

        if self._closed:
            raise EngineError("the engine client is closed; start a new one")
        prompt = token_list(prompt_token_ids)
        max_tokens = clamp_max_tokens(len(prompt), sampling, self.config.max_model_len)
        params = SamplingParams(
            n=1,
            max_tokens=max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else 0,
            seed=sampling.seed,
            stop_token_ids=list(sampling.stop_token_ids),
            ignore_eos=sampling.ignore_eos,
            logprobs=0,
            # Each output's logprobs as flat lists of primitives (vLLM's FlatLogprobs),
            # not a dict of Logprob objects per token: see _sampled_logprobs.
            flat_logprobs=True,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
            # Made for this request alone: vLLM may take it as it is, rather than deep-copy
            # it (as its own OpenAI server does with the params it makes per request).
            skip_clone=True,
            stream_interval=STREAM_INTERVAL,
        )
        version = self._version
        self._inflight.start(request_id)
        finish_reason = "abort"
        spans = None
        try:
            async with asyncio.timeout(self.config.request_timeout_s):
                stream = self._engine.generate(
                    tokens_input(prompt), params, request_id, lora_request=self._lora
                )
                async for out in stream:
                    completion = out.outputs[0]
                    new_ids = list(completion.token_ids)
                    self._inflight.extend(
                        request_id, new_ids, _sampled_logprobs(new_ids, completion.logprobs)
                    )
                    if out.finished:
                        finish_reason = completion.finish_reason or "abort"
                        spans = completion.weight_versions
        except TimeoutError as e:
            await self._engine.abort(request_id)
            self._inflight.fail(request_id, e)
            raise EngineError(
                f"request {request_id!r} took longer than {self.config.request_timeout_s} s "
                f"(inference.request_timeout_s)"
            ) from e
        except asyncio.CancelledError:
            self._inflight.fail(request_id, asyncio.CancelledError())
            raise
        except BaseException as e:
            self._inflight.fail(request_id, e)
            if isinstance(e, Exception) and not isinstance(e, EngineError):
                raise EngineError(f"vLLM failed request {request_id!r}: {e}") from e
            raise
        if finish_reason not in ("stop", "length", "abort"):
            finish_reason = "abort"
        return self._inflight.finish(
            request_id, finish_reason, version, len(prompt), _span_versions(spans, version)
        )

    async def reload_weights(
        self, weights_dir: str, version: int | None = None, *, keep_inflight: bool = False
    ) -> int:
        """Load the safetensors in ``weights_dir`` into the running engine.

        By default requests in flight finish under the old weights first (vLLM's pause
        in ``wait`` mode), so every token keeps a true version label; the rollout
        controller aborts long requests before calling this. With ``keep_inflight``
        they are frozen instead (``keep`` mode) and continue under the new weights
        with the KV cache computed by the old ones.
        """

        async def reload(new_version: int) -> None:
            await self._engine.collective_rpc(
                "reload_weights", kwargs={"weights_path": str(weights_dir)}
            )

        return await self._update(
            f"reloading weights from {str(weights_dir)!r}", reload, version, keep_inflight
        )

    async def load_lora_adapter(
        self, adapter_dir: str, version: int | None = None, *, keep_inflight: bool = False
    ) -> int:
        """Serve later requests with the peft adapter saved in ``adapter_dir``.

        Requests in flight keep the adapter they started with (vLLM binds a request to
        its LoRA at admission), whatever ``keep_inflight`` says.
        """
        from vllm.lora.request import LoRARequest

        if self.max_lora_rank is None:
            raise WeightSyncError(
                "this engine was started without LoRA; start it with max_lora_rank set "
                "(agentrl train does so when trainer.lora.enabled = true)"
            )

        async def load(new_version: int) -> None:
            self._lora_ids += 1
            request = LoRARequest(f"adapter-v{new_version}", self._lora_ids, str(adapter_dir))
            await self._engine.add_lora(request)
            previous, self._lora = self._lora, request
            if previous is not None and not keep_inflight:
                await self._engine.remove_lora(previous.lora_int_id)

        return await self._update(
            f"loading the LoRA adapter in {str(adapter_dir)!r}", load, version, keep_inflight
        )

    async def push_weights(
        self,
        send: Callable[[], object],
        version: int | None = None,
        *,
        keep_inflight: bool = False,
    ) -> int:
        """Load weights that ``send`` streams in (blocking; run in a worker thread).

        For vLLM's weight-transfer engines (NCCL): ``send`` is the trainer side of the
        transfer (see :mod:`agentrl.trainer.nccl`); the engine must have been started
        with ``InferenceConfig(weight_transfer=...)``.
        """
        if not self.config.weight_transfer:
            raise WeightSyncError(
                "this engine was started without a weight-transfer backend; set "
                "inference.weight_transfer = 'nccl' (GPU only)"
            )

        async def load(new_version: int) -> None:
            await asyncio.to_thread(send)

        return await self._update("pushing weights", load, version, keep_inflight)

    async def sleep(self) -> None:
        """Free the GPU for a train step: vLLM's sleep level 1 (weights to CPU memory, KV
        cache dropped); nothing may be in flight. Needs ``inference.sleep_during_train``."""
        if self._inflight.ids():
            raise WeightSyncError(
                "vLLM cannot sleep with requests in flight (train.mode "
                "must be 'sync' for inference.sleep_during_train)"
            )
        await self._engine.sleep(level=1)

    async def wake_up(self) -> None:
        """Back from :meth:`sleep`: weights on the GPU again, a fresh KV cache."""
        await self._engine.wake_up()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        ids = self._inflight.ids()
        if ids:
            self._inflight.aborted.update(ids)
            await self._engine.abort(ids)
        # Shutting down kills the engine core under AsyncLLM's output handler, which then
        # logs an EngineDeadError traceback: expected here, so not shown.
        handler_log = logging.getLogger("vllm.v1.engine.async_llm")
        level = handler_log.level
        handler_log.setLevel(logging.CRITICAL)
        try:
            await asyncio.to_thread(self._engine.shutdown, timeout=ENGINE_EXIT_TIMEOUT_S)
            # vLLM's __del__ shuts down again; run it now, not at interpreter teardown
            # where it fails on half-destroyed module globals.
            del self._engine
            gc.collect()
            await asyncio.sleep(0.1)
        finally:
            handler_log.setLevel(level)
            cores.release(self._cores_claim)
            self._cores_claim = None

    # -- the hooks of VLLMClientBase -------------------------------------------------------

    async def _stop(self, request_id: str) -> None:
        await self._engine.abort(request_id)

    async def _pause(self, keep_inflight: bool) -> None:
        if keep_inflight:
            await self._engine.pause_generation(mode="keep", clear_cache=False)
        else:
            await self._engine.pause_generation(mode="wait")

    async def _resume(self) -> None:
        await self._engine.resume_generation()

    async def _reset_prefix_cache(self) -> None:
        await self._engine.reset_prefix_cache()

    async def _label_weights(self, version: int) -> None:
        await self._engine.update_weight_version(str(version))


def _engine_args(
    model_path: str, config: InferenceConfig, seed: int | None, max_lora_rank: int | None
) -> AsyncEngineArgs:
    """vLLM's ``AsyncEngineArgs`` for ``config`` (imports vLLM)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs(
        model=model_path,
        dtype=config.dtype,
        max_model_len=config.max_model_len,
        **(
            {"gpu_memory_utilization": config.gpu_memory_utilization}
            if config.gpu_memory_utilization is not None
            else {"kv_cache_memory_bytes": config.kv_cache_bytes}
        ),
        enable_sleep_mode=config.sleep_during_train,
        enforce_eager=config.enforce_eager,
        **({} if seed is None else {"seed": seed}),
        enable_lora=max_lora_rank is not None,
        **({} if max_lora_rank is None else {"max_lora_rank": max_lora_rank}),
        max_num_seqs=config.max_num_seqs,
        # Behaviour logprobs of the distribution actually sampled from (after
        # temperature, top-k, top-p): what importance correction needs.
        logprobs_mode="processed_logprobs",
        disable_log_stats=True,
        # No progress bar on every weight reload (it would break the live display).
        use_tqdm_on_load=False,
        **(
            {"weight_transfer_config": {"backend": config.weight_transfer}}
            if config.weight_transfer
            else {}
        ),
    )


async def _build(
    args: AsyncEngineArgs, config: InferenceConfig, model_path: str, log: Path | None
) -> AsyncLLM:
    """``AsyncLLM.from_engine_args(args)`` in a thread, under ``startup_timeout_s``
    (``log``: where the engine's processes print, named in the error)."""
    from vllm.v1.engine.async_llm import AsyncLLM

    def build() -> AsyncLLM:
        # Its worker binds itself among the cores this thread may use: all of them,
        # even while another engine keeps this process off its worker's.
        with cores.every_core():
            return AsyncLLM.from_engine_args(args)

    see = f"; its output is in {log}" if log is not None else ""
    try:
        return await asyncio.wait_for(asyncio.to_thread(build), timeout=config.startup_timeout_s)
    except TimeoutError as e:
        raise EngineStartupError(
            f"vLLM did not start within {config.startup_timeout_s} s "
            f"(inference.startup_timeout_s) for model {model_path!r}{see}"
        ) from e
    except Exception as e:
        raise EngineStartupError(
            f"vLLM failed to start for model {model_path!r}: {type(e).__name__}: {e}{see}"
        ) from e


def _sampled_logprobs(token_ids: list[int], logprobs: Any) -> list[float]:
    """The logprob of each sampled token, from an output's ``logprobs``.

    With ``logprobs=0`` every position holds the sampled token alone, so vLLM's
    ``FlatLogprobs`` (``flat_logprobs=True``) has one entry a position and its
    ``token_ids`` are the sampled ids: its ``logprobs`` list is the answer as it stands.
    Anything else (a list of per-position dicts, or extra entries) is read position by
    position; a position without its sampled token raises ``KeyError``, as before.
    """
    if logprobs is None:
        return []
    if getattr(logprobs, "token_ids", None) == token_ids and len(logprobs) == len(token_ids):
        return logprobs.logprobs  # a fresh slice per output; the caller copies it in
    return [step[tok].logprob for tok, step in zip(token_ids, logprobs, strict=True)]


def _span_versions(spans: Any, default: int) -> tuple[int, ...] | None:
    """Per-token versions from vLLM's weight-version spans (None: use ``default``)."""
    if not spans:
        return None
    versions: list[int] = []
    for span in spans:
        try:
            label = int(span.version)
        except ValueError:
            label = default
        versions.extend([label] * (span.end - span.start))
    return tuple(versions)

"""``Trainer``: one optimizer step from complete groups, with importance correction.

The model is a transformers causal LM with float32 weights (optionally wrapped with a
peft LoRA adapter), on ``trainer.device`` (:mod:`agentrl.trainer.placement`: this
process's GPU when there is one), computing in ``trainer.precision`` (bf16 autocast on a
GPU, fp32 on CPU). A step: group-relative advantages (per episode, or per turn as
``trainer.loss.advantage`` says); micro-batches, padded or packed without padding
(``trainer.packing``, :mod:`agentrl.trainer.packing`); for each, the current policy's
logprobs of the sampled tokens at the sampling temperature (TRL's
``selective_log_softmax`` over the full logits, or with ``trainer.chunked_logprob``
TRL's chunked LM-head kernel, which never holds a micro-batch's full-vocabulary logits
and scores only the tokens the loss covers); importance weights from the proximal
policy (the model before this step) to the behaviour policy (vLLM's logprobs of each
token), times the masks that drop tokens or sequences too far off-policy
(:mod:`agentrl.trainer.corrections`); the configured loss (``dppo`` takes its ratio
against the behaviour policy itself and gets no importance weights); backward; then
gradient clipping and one AdamW step.

Reported per step: loss, clip fraction, IS weight min/mean/max, the fraction of tokens
the off-policy masks dropped (in all and per mask), the trainer-vs-vLLM logprob gap on
the freshest tokens (sampled by the version being trained), token staleness
min/mean/max in versions, tokens trained and the gradient norm.

The heavy work runs in a worker thread (``asyncio.to_thread``); call
:meth:`Trainer.pin` once in that thread to keep it off vLLM's core on small machines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from agentrl import cores, faults
from agentrl.config import TrainerConfig
from agentrl.errors import ConfigError
from agentrl.trainer import packing as packed_attention
from agentrl.trainer.batch import (
    MicroBatch,
    Packed,
    micro_batches,
    packed_micro_batches,
    rows_from_groups,
)
from agentrl.trainer.corrections import CorrectionMasks, correction_masks
from agentrl.trainer.losses import importance_weights, policy_loss
from agentrl.trainer.models import ModelLoad
from agentrl.trainer.placement import (
    describe_device,
    is_out_of_memory,
    memory_error,
    resolve_device,
    resolve_precision,
    resolve_switch,
)
from agentrl.trainer.tokenrecord import TokenRecorder
from agentrl.types import Group

logger = logging.getLogger(__name__)


@dataclasses.dataclass(slots=True)
class StepStats:
    step: int
    version: int
    loss: float
    clip_fraction: float
    is_weight_min: float
    is_weight_mean: float
    is_weight_max: float
    masked_fraction: float
    """Tokens the off-policy masks (Geo-RS, IcePop, outlier) dropped, of those trained."""
    geo_masked_fraction: float
    token_masked_fraction: float
    outlier_masked_fraction: float
    logprob_gap_fresh: float
    """Mean |trainer logprob - vLLM logprob| on tokens sampled by the version trained."""
    fresh_tokens: int
    staleness_min: float
    staleness_mean: float
    staleness_max: float
    tokens: int
    sequences: int
    grad_norm: float
    kl: float
    reward_mean: float
    step_s: float

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Trainer:
    """Holds the model and optimizer; :meth:`train_step` runs one optimizer step."""

    def __init__(
        self,
        model_path: str,
        config: TrainerConfig | None = None,
        *,
        temperature: float,
        seed: int,
        accelerator: Any = None,
        recorder: TokenRecorder | None = None,
    ) -> None:
        """Load the model (and a LoRA adapter, and a reference model for KL).

        ``temperature``: the sampling temperature (``rollout.temperature``); logprobs
        are taken of logits / temperature, as vLLM's are. ``seed``: ``run.seed``.

        ``accelerator``: an ``accelerate.Accelerator`` to train across processes (DDP,
        or FSDP2 as configured); every rank builds its Trainer the same way and calls
        :meth:`train_step` with the same groups (see :mod:`agentrl.trainer.distributed`).
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not temperature > 0:
            raise ConfigError(
                f"rollout.temperature = {temperature!r}; training needs it > 0 (logprobs are "
                f"taken of logits / temperature)"
            )
        self.config = config or TrainerConfig()
        self._cores = cores.process_cores()  # what pin(every_core=True) lends
        self.lend_cores: Callable[[], bool] | None = None
        """Asked before each micro-step on CPU: may it use every core (generation idle)?"""
        self._on_every_core = False
        self.micro_steps = {"all": 0, "every_core": 0}
        self.temperature = temperature
        cfg = self.config
        self._device = resolve_device(cfg.device, accelerator)
        self.precision = resolve_precision(cfg.precision, self._device)
        """``bf16`` (autocast compute, fp32 weights and optimizer state) or ``fp32``."""
        self.packing = resolve_switch(cfg.packing, self._device)
        self.chunked_logprob = resolve_switch(cfg.chunked_logprob, self._device)
        self.attention = ""
        """The attention implementation of packed micro-batches ('' when not packing)."""
        if self.packing:
            self.attention = packed_attention.implementation(
                cfg.packed_attention, self._device, self.precision
            )
        torch.manual_seed(seed)
        self.model_path = model_path
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        loader = ModelLoad(cfg, self.packing, self.attention, self.chunked_logprob, temperature)
        self.model, self.ref_model = loader.policy_and_reference(
            AutoModelForCausalLM, model_path, self._device
        )
        self.model.train()
        if accelerator is None:
            self.model.to(self._device)
        params = [p for p in self.model.parameters() if p.requires_grad]
        fused = accelerator is None and self._device.type == "cuda"
        self.optimizer = torch.optim.AdamW(
            params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay,
            **({"fused": True} if fused else {}),
        )  # fmt: skip
        self.accelerator = accelerator
        self.recorder = recorder  # the per-token record of each trained row, if kept
        self._full_state: dict[str, torch.Tensor] | None = None
        self.rank, self.world = 0, 1
        if accelerator is not None:
            self.model, self.optimizer = accelerator.prepare(self.model, self.optimizer)
            self.rank, self.world = accelerator.process_index, accelerator.num_processes
            if hasattr(self.model, "broadcast_buffers"):
                # DDP would broadcast buffers (rotary tables) at every forward, a
                # collective; ranks run different numbers of micro-batches. The buffers
                # are constants, so nothing needs syncing but the gradients.
                self.model.broadcast_buffers = False
        self.step = 0
        self._version = 0
        self.pad_id = int(self.tokenizer.pad_token_id or 0)

    def placement(self) -> str:
        """Where and how the trainer runs, in one line (``agentrl train`` says it at start)."""
        parts = [f"trainer on {describe_device(self._device)}",
                 "bf16 autocast (fp32 weights and AdamW state)" if self.precision == "bf16"
                 else "fp32"]  # fmt: skip
        budget = f"{self.config.micro_batch_tokens} tokens"
        if self.packing:
            parts.append(f"packed micro-batches of <= {budget} ({self.attention} attention)")
        else:
            parts.append(f"padded micro-batches of <= {budget}")
        if self.chunked_logprob:
            parts.append("chunked logprob")
        if self.config.compile:
            parts.append("compiled layers")
        if self.config.gradient_checkpointing:
            parts.append("gradient checkpointing")
        if self.config.activation_offload:
            parts.append("activation offload")
        if self.is_lora:
            parts.append(f"LoRA r={self.config.lora.r}")
        return ", ".join(parts)

    def advice(self) -> list[tuple[str, str]]:
        """Settings that measured slow on a GPU (an H200, benchmarks/results/
        trainer_cuda_h200.md): ``(level, line)`` pairs, level ``note`` (a default's) or
        ``warning`` (a setting worth changing); empty on CPU."""
        if self._device.type != "cuda":
            return []
        tokens = self.config.micro_batch_tokens
        if tokens >= 16_384:
            return []
        out = [
            (
                "note",
                f"trainer.micro_batch_tokens = {tokens}: small micro-batches leave the GPU "
                f"waiting on the host (an H200 ran the Qwen2.5-0.5B shape at 15.6 % MFU with "
                f"4,096, 40.8 % with 32,768, compile and checkpointing); raise it as memory "
                f"allows (trainer.gradient_checkpointing = true frees most activations)",
            )
        ]
        if self.config.compile:
            out.append(
                (
                    "warning",
                    f"trainer.compile = true with micro-batches of {tokens} tokens: "
                    f"compiled layers were slower than eager ones below 16,384 tokens on "
                    f"an H200 (1.18 against 0.86 s a step at 8,192)",
                )
            )
        return out

    @property
    def version(self) -> int:
        """The policy version of these weights: the one last published (or restored).

        Read-only; :meth:`set_version` is its one writer.
        """
        return self._version

    def set_version(self, version: int) -> None:
        """Record that these weights are policy ``version`` (the engine now serves them
        under that label, or a checkpoint restored them).

        Raises:
            ValueError: ``version`` is negative.
        """
        if version < 0:
            raise ValueError(f"a policy version is >= 0, got {version}")
        self._version = int(version)

    @property
    def is_lora(self) -> bool:
        return self.config.lora.enabled

    @property
    def sharded(self) -> bool:
        """Whether the weights are sharded across processes (FSDP): publishing and
        checkpoints then need the full weights gathered (:meth:`full_state_dict`)."""
        return self._sharded()

    def _sharded(self) -> bool:
        if self.accelerator is None:
            return False
        return "FSDP" in str(getattr(self.accelerator, "distributed_type", ""))

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The full (unsharded) weights, for publishing and checkpoints.

        Under FSDP they were gathered onto rank 0's CPU at the end of the last step (a
        collective all ranks join; the other ranks get an empty dict); otherwise the
        local model holds them.
        """
        if self._full_state is not None:
            return self._full_state
        return {k: v.detach().contiguous() for k, v in self.unwrapped.state_dict().items()}

    def gather_full_state(self) -> None:
        """Under FSDP: gather the full weights onto rank 0's CPU, for :meth:`full_state_dict`.

        A collective: every rank calls it (after each step, and after a checkpoint is
        loaded); the other ranks keep an empty dict.
        """
        self._full_state = self.accelerator.get_state_dict(self.model)

    def save_adapter(self, folder: str | os.PathLike[str]) -> None:
        """Write a LoRA run's adapter as peft's files (``adapter_model.safetensors``,
        ``adapter_config.json``) into ``folder``.

        Under FSDP the adapter comes from the full weights gathered at the end of the
        last step (rank 0; :meth:`full_state_dict`): the model's own are shards.
        """
        if self.sharded:
            self.unwrapped.save_pretrained(folder, state_dict=self.full_state_dict())
        else:
            self.unwrapped.save_pretrained(folder)

    @property
    def unwrapped(self) -> Any:
        """The model without its distributed wrapper (for saving and adapter control)."""
        if self.accelerator is None:
            return self.model
        return self.accelerator.unwrap_model(self.model)

    def pin(self, cores: set[int] | None = None, *, every_core: bool = False) -> None:
        """Keep the calling thread (the trainer's) on ``cores`` with few torch threads.

        Default: every core but 0 when there are at least two (vLLM's CPU worker binds
        to core 0). See docs/cpu-overlap in the shared docs for the measurements.
        ``every_core``: lend the trainer every core of the process, one torch thread
        each, for a step that generation waits for anyway (CPU only; a call without it
        takes them back).
        """
        if self.device.type != "cpu":
            return
        if every_core:
            cores = self._cores
            torch.set_num_threads(len(cores))
        elif self.config.torch_threads is not None:
            torch.set_num_threads(self.config.torch_threads)
        if cores is None:
            cores = self._cores - {0} if len(self._cores) > 1 else self._cores
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cores)

    def _share_cores(self) -> None:
        """Before a micro-step: take every core while generation waits for this step,
        give them back as soon as it runs again (CPU only; ``lend_cores`` decides)."""
        self.micro_steps["all"] += 1
        if self.lend_cores is None or self.device.type != "cpu":
            return
        lend = self.lend_cores()
        if lend != self._on_every_core:
            self.pin(every_core=lend)
            self._on_every_core = lend
        self.micro_steps["every_core"] += lend

    @property
    def device(self) -> torch.device:
        """Where the model's parameters are (micro-batches are moved there)."""
        return self._device

    def micro_batches(self, rows: Sequence[Any]) -> list[MicroBatch]:
        """``rows`` in micro-batches of ``trainer.micro_batch_tokens``, packed or padded."""
        if self.packing:
            return packed_micro_batches(rows, self.config.micro_batch_tokens, self.pad_id)
        return micro_batches(rows, self.config.micro_batch_tokens, self.pad_id)

    def _autocast(self) -> Any:
        if self.precision != "bf16":
            return contextlib.nullcontext()
        return torch.autocast(self._device.type, dtype=torch.bfloat16)

    def logprobs(self, model: Any, mb: MicroBatch) -> torch.Tensor:
        """Per-token logprobs of ``mb.targets`` under ``model`` (shape of ``mb.targets``, fp32).

        With the chunked logprob only the tokens of ``mb.mask`` are scored (the others
        are 0: no loss, mask or statistic reads them).
        """
        with self._autocast():
            if mb.packed is not None:
                return self._packed_logprobs(model, mb.packed)
            if self.chunked_logprob:
                labels = torch.where(mb.mask > 0, mb.targets, -100)
                labels = torch.nn.functional.pad(labels, (1, 0), value=-100)
                out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask,
                            labels=labels, fused_lm_head=True, use_cache=False)  # fmt: skip
                return out.log_probs.float()
            logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask,
                           use_cache=False).logits  # fmt: skip
            return self._select(logits[:, :-1, :], mb.targets)

    def _packed_logprobs(self, model: Any, p: Packed) -> torch.Tensor:
        """Logprobs of a packed micro-batch, laid out as its padded rows."""
        kwargs = {"input_ids": p.input_ids, "position_ids": p.position_ids,
                  "cu_seq_lens_q": p.cu_seqlens, "cu_seq_lens_k": p.cu_seqlens,
                  "max_length_q": p.max_len, "max_length_k": p.max_len,
                  "use_cache": False}  # fmt: skip
        if self.chunked_logprob:
            labels = torch.where(p.select, p.targets, -100)
            flat = model(**kwargs, shift_labels=labels, fused_lm_head=True).log_probs[0].float()
        else:
            flat = self._select(model(**kwargs).logits, p.targets)[0]
        return torch.where(p.valid, flat[p.index], 0.0)

    def _select(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        from trl.trainer.utils import selective_log_softmax

        if logits.dtype != torch.float32 and logits.device.type != "cuda":
            logits = logits.float()  # TRL's CPU path would take the log-softmax in bf16
        return selective_log_softmax(logits, targets, self.temperature).float()

    def score(self, groups: Sequence[Group]) -> list[tuple[torch.Tensor, MicroBatch]]:
        """Current-policy logprobs of every micro-batch (no gradient), for diagnostics."""
        rows = rows_from_groups(groups, self.config.scale_rewards, self.config.loss)
        out = []
        with torch.no_grad():
            for mb in self.micro_batches(rows):
                mb = mb.to(self.device)
                out.append((self.logprobs(self.model, mb), mb))
        return out

    def train_step(self, groups: Sequence[Group]) -> StepStats:
        """One optimizer step on ``groups``; the model's version becomes ``version + 1``
        once the caller publishes it (see :class:`~agentrl.trainer.publish.WeightPublisher`).

        Raises:
            TrainerMemoryError: the step ran out of GPU memory; the message names the
                settings that make it fit.
        """
        try:
            return self._train_step(groups)
        except Exception as e:
            if not is_out_of_memory(e):
                raise
            self.optimizer.zero_grad(set_to_none=True)
            params = sum(p.numel() for p in self.model.parameters())
            trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
            error = memory_error(
                e, self.config, device=self._device, precision=self.precision,
                packing=self.packing, chunked=self.chunked_logprob, step=self.step,
                parameters=params, trainable=trainable,
            )  # fmt: skip
            del e
            if self._device.type == "cuda":
                torch.cuda.empty_cache()
            raise error from None

    def _train_step(self, groups: Sequence[Group]) -> StepStats:
        t0 = time.perf_counter()
        cfg = self.config
        rows = rows_from_groups(groups, cfg.scale_rewards, cfg.loss)
        # Totals over the whole step (all ranks), so the loss does not depend on how
        # rows are split into micro-batches or across processes.
        total_tokens = float(sum(float(r.trajectory.loss_mask[1:].sum()) for r in rows))
        total_rows = len(rows)
        batches = self.micro_batches(rows[self.rank :: self.world])
        self.optimizer.zero_grad(set_to_none=True)
        acc: dict[str, Any] = {"loss": 0.0, "clipped": 0.0, "tokens": 0.0, "w_min": float("inf"),
               "w_max": 0.0, "w_sum": 0.0, "gap_sum": 0.0, "gap_n": 0, "st_min": float("inf"),
               "st_max": 0.0, "st_sum": 0.0, "kl": 0.0, "dropped": 0.0, "geo": 0.0,
               "token": 0.0, "outlier": 0.0, "pending": []}  # fmt: skip
        # FSDP gathers the weights in every forward and backward (collectives), so every
        # rank runs as many micro-steps as the busiest one, the extra ones on a padding
        # micro-batch that carries no loss. DDP only syncs in the last backward.
        count = self._micro_step_count(len(batches))
        for i in range(count):
            self._share_cores()
            with self._sync(last=i == count - 1):
                if i < len(batches):
                    self._micro_step(batches[i], acc, total_tokens, total_rows, len(batches))
                else:
                    self._micro_step(self._padding_batch(), {**acc, "pending": []}, total_tokens,
                                     total_rows, 1)  # fmt: skip
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.accelerator is not None:
            if not count:  # this rank had no rows: still join the gradient all-reduce
                ids = torch.zeros(1, 2, dtype=torch.long, device=self.device)
                dummy = self.model(input_ids=ids, use_cache=False).logits.sum()
                self.accelerator.backward(dummy * 0.0)
            norm = self.accelerator.clip_grad_norm_(params, cfg.max_grad_norm)
        else:
            norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        if self._on_every_core:  # give vLLM's core back before generation needs it
            self._on_every_core = False
            self.pin()
        faults.point("optimizer_step")
        if total_rows:
            self.optimizer.step()
        self.step += 1
        if self._sharded():  # FSDP: a collective on every rank; rank 0 gets the full weights
            self.gather_full_state()
        grad_norm = float(norm)  # read after the optimizer step is queued, like the rest
        self._settle(acc)
        tokens = acc["tokens"]
        rewards = [t.reward for g in groups for t in g.trajectories if t.segment == 0]
        return StepStats(
            step=self.step,
            version=self.version,
            loss=acc["loss"],
            clip_fraction=acc["clipped"] / tokens if tokens else 0.0,
            is_weight_min=acc["w_min"] if tokens else 1.0,
            is_weight_mean=acc["w_sum"] / tokens if tokens else 1.0,
            is_weight_max=acc["w_max"] if tokens else 1.0,
            masked_fraction=acc["dropped"] / tokens if tokens else 0.0,
            geo_masked_fraction=acc["geo"] / tokens if tokens else 0.0,
            token_masked_fraction=acc["token"] / tokens if tokens else 0.0,
            outlier_masked_fraction=acc["outlier"] / tokens if tokens else 0.0,
            logprob_gap_fresh=acc["gap_sum"] / acc["gap_n"] if acc["gap_n"] else float("nan"),
            fresh_tokens=acc["gap_n"],
            staleness_min=acc["st_min"] if tokens else 0.0,
            staleness_mean=acc["st_sum"] / tokens if tokens else 0.0,
            staleness_max=acc["st_max"],
            tokens=int(tokens),
            sequences=len(rows),
            grad_norm=grad_norm,
            kl=acc["kl"] / max(len(batches), 1),
            reward_mean=float(sum(rewards) / len(rewards)) if rewards else 0.0,
            step_s=time.perf_counter() - t0,
        )

    def _micro_step(self, mb: MicroBatch, acc: dict[str, Any], total_tokens: float,
                    total_rows: int, count: int) -> None:  # fmt: skip
        cfg = self.config
        mb = mb.to(self.device)
        mask = mb.mask
        if cfg.loss.max_token_staleness is not None:
            mask = mask * ((self.version - mb.versions) <= cfg.loss.max_token_staleness)
        if cfg.activation_offload:
            offload: Any = torch.autograd.graph.save_on_cpu(pin_memory=self.device.type == "cuda")
        else:
            offload = contextlib.nullcontext()
        with offload:
            logprobs = self.logprobs(self.model, mb)
        old = logprobs.detach()
        lc = cfg.loss
        if lc.kind == "dppo":  # its ratio is to the behaviour policy: nothing to correct
            weights = torch.ones_like(old)
        else:
            weights = importance_weights(old, mb.behaviour_logprobs, mask, lc.correction,
                                         lc.correction_min, lc.correction_max)  # fmt: skip
        masks = correction_masks(old, mb.behaviour_logprobs, mask, lc)
        if self.recorder is not None:
            self.recorder.add(self.step + 1, mb, old, weights, masks.keep)
        ref = self._ref_logprobs(mb) if cfg.loss.beta > 0 else None
        loss, stats = policy_loss(
            logprobs, mb.behaviour_logprobs if lc.kind == "dppo" else old, mb.advantages,
            mask, cfg.loss, is_weights=weights * masks.keep, ref_logprobs=ref,
            num_items=total_tokens, num_sequences=total_rows, accumulation_steps=count,
        )  # fmt: skip
        if self.accelerator is None:
            loss.backward()
        else:  # the wrapper averages gradients over ranks; each loss is a share of the sum
            self.accelerator.backward(loss * self.world)
        self._accumulate(acc, loss, stats, mb, mask, old, weights, masks)

    def _micro_step_count(self, local: int) -> int:
        """Micro-steps this rank runs: its own, or under FSDP the most of any rank."""
        if not self._sharded():
            return local
        import torch.distributed as dist

        count = torch.tensor([local], dtype=torch.int64, device=self.accelerator.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return int(count.item())

    def _padding_batch(self) -> MicroBatch:
        """One row of two padding tokens, masked out: a forward and backward, no loss."""
        ids = torch.full((1, 2), self.pad_id, dtype=torch.long)
        packed = None
        if self.packing:
            packed = Packed(input_ids=ids, position_ids=torch.arange(2).unsqueeze(0),
                            targets=ids.clone(), select=torch.zeros(1, 2, dtype=torch.bool),
                            cu_seqlens=torch.tensor([0, 2], dtype=torch.int32), max_len=2,
                            index=torch.zeros(1, 1, dtype=torch.long),
                            valid=torch.zeros(1, 1, dtype=torch.bool))  # fmt: skip
        return MicroBatch(input_ids=ids, attention_mask=torch.ones_like(ids),
                          targets=ids[:, 1:].clone(), mask=torch.zeros(1, 1),
                          behaviour_logprobs=torch.zeros(1, 1),
                          versions=torch.full((1, 1), -1, dtype=torch.long),
                          advantages=torch.zeros(1, 1), packed=packed)  # fmt: skip

    def _sync(self, *, last: bool) -> Any:
        """Only the last micro-batch of a rank all-reduces gradients (forward included)."""
        if self.accelerator is None or last:
            return contextlib.nullcontext()
        return self.accelerator.no_sync(self.model)

    def _ref_logprobs(self, mb: MicroBatch) -> torch.Tensor:
        with torch.no_grad():
            if self.ref_model is not None:
                return self.logprobs(self.ref_model, mb)
            with self.unwrapped.disable_adapter():  # LoRA: the base model is the reference
                return self.logprobs(self.model, mb)

    # What each micro-step adds to the step's statistics, kept on the device until the
    # step ends: reading them at once (``float(t)``) would make the host wait for every
    # micro-step's backward, so that it could not queue the next one meanwhile.
    _PENDING = ("loss", "clipped", "tokens", "kl", "w_min", "w_max", "w_sum", "st_min",
                "st_max", "st_sum", "gap_sum", "gap_n", "dropped", "geo", "token",
                "outlier")  # fmt: skip

    def _accumulate(self, acc: dict[str, Any], loss: torch.Tensor, stats: dict[str, Any],
                    mb: MicroBatch, mask: torch.Tensor, old: torch.Tensor,
                    weights: torch.Tensor, masks: CorrectionMasks) -> None:  # fmt: skip
        """Queue this micro-step's statistics (device tensors; :meth:`_settle` reads them)."""
        on = mask.bool()
        inf = torch.tensor(float("inf"), device=on.device)
        w = weights.expand_as(mask)
        staleness = (self.version - mb.versions).to(torch.float32)
        fresh = on & (mb.versions == self.version)
        kl = stats.get("kl")
        values = (
            loss.detach(), stats["clipped"], on.sum(),
            kl if kl is not None else torch.zeros((), device=on.device),
            torch.where(on, w, inf).min(), torch.where(on, w, -inf).max(),
            torch.where(on, w, 0.0).sum(),
            torch.where(on, staleness, inf).min(), torch.where(on, staleness, -inf).max(),
            torch.where(on, staleness, 0.0).sum(),
            torch.where(fresh, (old - mb.behaviour_logprobs).abs(), 0.0).sum(), fresh.sum(),
            masks.dropped, masks.geo, masks.token, masks.outlier,
        )  # fmt: skip
        acc["pending"].append(torch.stack([torch.as_tensor(v, device=on.device).double()
                                           for v in values]))  # fmt: skip

    def _settle(self, acc: dict[str, Any]) -> None:
        """Fold the queued micro-step statistics into ``acc``: one read for the step."""
        pending = acc.pop("pending")
        if not pending:
            return
        for row in torch.stack(pending).tolist():
            v = dict(zip(self._PENDING, row, strict=True))
            acc["loss"] += v["loss"]
            acc["clipped"] += v["clipped"]
            acc["tokens"] += int(v["tokens"])
            acc["kl"] += v["kl"]
            for name in ("dropped", "geo", "token", "outlier"):
                acc[name] += v[name]
            if not v["tokens"]:
                continue
            acc["w_min"] = min(acc["w_min"], v["w_min"])
            acc["w_max"] = max(acc["w_max"], v["w_max"])
            acc["w_sum"] += v["w_sum"]
            acc["st_min"] = min(acc["st_min"], v["st_min"])
            acc["st_max"] = max(acc["st_max"], v["st_max"])
            acc["st_sum"] += v["st_sum"]
            acc["gap_sum"] += v["gap_sum"]
            acc["gap_n"] += int(v["gap_n"])

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
min/mean/max in versions, tokens trained and the gradient norm
(:class:`~agentrl.trainer.stepstats.StepStats`, totalled over the micro-steps by
:class:`~agentrl.trainer.stepstats.StepTally`).

The heavy work runs in a worker thread (``asyncio.to_thread``); call
:meth:`Trainer.pin` once in that thread to keep it off vLLM's core on small machines.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from agentrl.config import TrainerConfig
from agentrl.errors import ConfigError
from agentrl.runtime import cores, faults
from agentrl.trainer import packing as packed_attention
from agentrl.trainer.batch import (
    MicroBatch,
    micro_batches,
    packed_micro_batches,
    rows_from_groups,
)
from agentrl.trainer.corrections import correction_masks
from agentrl.trainer.forward import PolicyForward
from agentrl.trainer.losses import importance_weights, policy_loss
from agentrl.trainer.models import ModelLoad
from agentrl.trainer.placement import (
    describe_setup,
    is_out_of_memory,
    memory_error,
    resolve_device,
    resolve_precision,
    resolve_switch,
    setup_advice,
)
from agentrl.trainer.stepstats import StepStats, StepTally
from agentrl.trainer.tokenrecord import TokenRecorder
from agentrl.types import Group

logger = logging.getLogger(__name__)


class Trainer(PolicyForward):
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
            params,
            lr=cfg.lr,
            betas=cfg.betas,
            weight_decay=cfg.weight_decay,
            **({"fused": True} if fused else {}),
        )
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
        return describe_setup(
            self.config,
            self._device,
            self.precision,
            self.attention,
            packing=self.packing,
            chunked=self.chunked_logprob,
        )

    def advice(self) -> list[tuple[str, str]]:
        """Settings that measured slow on a GPU: ``(level, line)`` pairs (see
        :func:`~agentrl.trainer.placement.setup_advice`); empty on CPU."""
        return setup_advice(self.config, self._device)

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
                e,
                self.config,
                device=self._device,
                precision=self.precision,
                packing=self.packing,
                chunked=self.chunked_logprob,
                step=self.step,
                parameters=params,
                trainable=trainable,
            )
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
        tally = StepTally()
        # FSDP gathers the weights in every forward and backward (collectives), so every
        # rank runs as many micro-steps as the busiest one, the extra ones on a padding
        # micro-batch that carries no loss. DDP only syncs in the last backward.
        count = self._micro_step_count(len(batches))
        for i in range(count):
            self._share_cores()
            with self._sync(last=i == count - 1):
                if i < len(batches):
                    self._micro_step(batches[i], tally, total_tokens, total_rows, len(batches))
                else:
                    padding = self._padding_batch()  # its figures are dropped
                    self._micro_step(padding, StepTally(), total_tokens, total_rows, 1)
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
        tally.settle()
        return tally.stats(
            step=self.step,
            version=self.version,
            groups=groups,
            sequences=len(rows),
            micro_batches=len(batches),
            grad_norm=grad_norm,
            step_s=time.perf_counter() - t0,
        )

    def _micro_step(
        self, mb: MicroBatch, tally: StepTally, total_tokens: float, total_rows: int, count: int
    ) -> None:
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
            weights = importance_weights(
                old,
                mb.behaviour_logprobs,
                mask,
                lc.correction,
                lc.correction_min,
                lc.correction_max,
            )
        masks = correction_masks(old, mb.behaviour_logprobs, mask, lc)
        if self.recorder is not None:
            self.recorder.add(self.step + 1, mb, old, weights, masks.keep)
        ref = self._ref_logprobs(mb) if cfg.loss.beta > 0 else None
        loss, stats = policy_loss(
            logprobs,
            mb.behaviour_logprobs if lc.kind == "dppo" else old,
            mb.advantages,
            mask,
            cfg.loss,
            is_weights=weights * masks.keep,
            ref_logprobs=ref,
            num_items=total_tokens,
            num_sequences=total_rows,
            accumulation_steps=count,
        )
        if self.accelerator is None:
            loss.backward()
        else:  # the wrapper averages gradients over ranks; each loss is a share of the sum
            self.accelerator.backward(loss * self.world)
        tally.add(loss, stats, mb, mask, old, weights, masks, self.version)

    def _micro_step_count(self, local: int) -> int:
        """Micro-steps this rank runs: its own, or under FSDP the most of any rank."""
        if not self._sharded():
            return local
        import torch.distributed as dist

        count = torch.tensor([local], dtype=torch.int64, device=self.accelerator.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return int(count.item())

    def _sync(self, *, last: bool) -> Any:
        """Only the last micro-batch of a rank all-reduces gradients (forward included)."""
        if self.accelerator is None or last:
            return contextlib.nullcontext()
        return self.accelerator.no_sync(self.model)

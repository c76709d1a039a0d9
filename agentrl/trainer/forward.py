"""The policy's forward passes over a micro-batch: a part of the ``Trainer``.

Per-token logprobs of the sampled tokens at the sampling temperature: padded rows
(TRL's ``selective_log_softmax`` over the full logits), packed rows
(:mod:`agentrl.trainer.packing`), or with ``trainer.chunked_logprob`` TRL's chunked
LM-head kernel, which scores only the tokens the loss covers; the reference model's
(for KL); and the padding micro-batch a rank runs when it has no rows left (FSDP).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from agentrl.trainer.batch import MicroBatch, Packed


class PolicyForward:
    """The forward passes of :class:`~agentrl.trainer.trainer.Trainer` (its base class),
    which sets these attributes."""

    model: Any
    ref_model: Any
    temperature: float
    precision: str
    packing: bool
    chunked_logprob: bool
    pad_id: int
    unwrapped: Any
    _device: torch.device

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
                out = model(
                    input_ids=mb.input_ids,
                    attention_mask=mb.attention_mask,
                    labels=labels,
                    fused_lm_head=True,
                    use_cache=False,
                )
                return out.log_probs.float()
            logits = model(
                input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False
            ).logits
            return self._select(logits[:, :-1, :], mb.targets)

    def _packed_logprobs(self, model: Any, p: Packed) -> torch.Tensor:
        """Logprobs of a packed micro-batch, laid out as its padded rows."""
        kwargs = {
            "input_ids": p.input_ids,
            "position_ids": p.position_ids,
            "cu_seq_lens_q": p.cu_seqlens,
            "cu_seq_lens_k": p.cu_seqlens,
            "max_length_q": p.max_len,
            "max_length_k": p.max_len,
            "use_cache": False,
        }
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

    def _padding_batch(self) -> MicroBatch:
        """One row of two padding tokens, masked out: a forward and backward, no loss."""
        ids = torch.full((1, 2), self.pad_id, dtype=torch.long)
        packed = None
        if self.packing:
            packed = Packed(
                input_ids=ids,
                position_ids=torch.arange(2).unsqueeze(0),
                targets=ids.clone(),
                select=torch.zeros(1, 2, dtype=torch.bool),
                cu_seqlens=torch.tensor([0, 2], dtype=torch.int32),
                max_len=2,
                index=torch.zeros(1, 1, dtype=torch.long),
                valid=torch.zeros(1, 1, dtype=torch.bool),
            )
        return MicroBatch(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            targets=ids[:, 1:].clone(),
            mask=torch.zeros(1, 1),
            behaviour_logprobs=torch.zeros(1, 1),
            versions=torch.full((1, 1), -1, dtype=torch.long),
            advantages=torch.zeros(1, 1),
            packed=packed,
        )

    def _ref_logprobs(self, mb: MicroBatch) -> torch.Tensor:
        with torch.no_grad():
            if self.ref_model is not None:
                return self.logprobs(self.ref_model, mb)
            with self.unwrapped.disable_adapter():  # LoRA: the base model is the reference
                return self.logprobs(self.model, mb)

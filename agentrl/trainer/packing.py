"""Attention for packed micro-batches: rows side by side in one sequence, never mixed.

A packed micro-batch is one row of ``N`` tokens holding several trajectories one after
the other; ``position_ids`` restart at 0 for each, and ``cu_seq_lens_q`` (the offsets
``0, n_1, n_1 + n_2, ..., N``, FlashAttention's varlen convention, also transformers')
says where each begins. The model is called with those as keyword arguments; they reach
every attention layer, and attention is causal within each trajectory only.

transformers' own packed support is not used with SDPA: given packed ``position_ids`` it
builds a dense ``N x N`` block-diagonal mask, whose memory grows with the square of the
packed length and which keeps SDPA off its fast kernels (measured on an H200:
``/work/shared/docs/gpu-trainer-measurements.md``). Instead two attention functions are
registered with transformers' ``AttentionInterface``:

* ``agentrl_varlen``: torch's ``varlen_attn`` (FlashAttention's varlen kernel, CUDA, bf16
  or fp16): one kernel over all rows;
* ``agentrl_rows``: SDPA once per trajectory (``is_causal``, no mask), any device and
  dtype; the correct fallback, and the CPU path.

Both fall back to transformers' SDPA for calls without ``cu_seq_lens_q`` (a padded batch,
generation), so a model set to either behaves as an SDPA model otherwise. The
implementation name is not saved with the model (transformers does not write it to
``config.json``). ``flash_attention_2`` and ``flex_attention`` (transformers' own, which
read the same keyword arguments or ``position_ids``) can be chosen instead.
"""

from __future__ import annotations

import inspect
import itertools
from typing import Any

import torch

from agentrl.errors import ConfigError

VARLEN = "agentrl_varlen"
ROWS = "agentrl_rows"
_registered = False


def varlen_available(device: torch.device) -> bool:
    """Whether torch's FlashAttention varlen kernel can run on ``device``."""
    if device.type != "cuda":
        return False
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


def implementation(setting: str, device: torch.device, precision: str) -> str:
    """The transformers attention implementation for ``trainer.packed_attention``.

    Raises:
        ConfigError: varlen without its kernel (no CUDA, an old torch, or fp32).
    """
    if setting == "auto":
        return VARLEN if varlen_available(device) and precision == "bf16" else ROWS
    if setting == "varlen":
        if not varlen_available(device):
            raise ConfigError(
                f"trainer.packed_attention = 'varlen' needs CUDA and torch's "
                f"torch.nn.attention.varlen (torch {torch.__version__}, device {device}); "
                f"use 'auto' or 'rows'"
            )
        if precision != "bf16":
            raise ConfigError(
                "trainer.packed_attention = 'varlen' runs FlashAttention, which has no fp32; "
                "set trainer.precision = 'bf16' or use packed_attention = 'rows'"
            )
        return VARLEN
    if setting == "rows":
        return ROWS
    if setting == "flex_attention" and device.type != "cuda":
        raise ConfigError(
            "trainer.packed_attention = 'flex_attention' has no backward on CPU "
            "(torch's FlexAttention); use 'rows' or 'auto'"
        )
    return setting


def register() -> None:
    """Register the two attention functions (and their mask functions) once."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface, AttentionMaskInterface

    AttentionInterface.register(VARLEN, _varlen_attention)
    AttentionInterface.register(ROWS, _rows_attention)
    AttentionMaskInterface.register(VARLEN, _mask)
    AttentionMaskInterface.register(ROWS, _mask)
    _registered = True


def _mask(*args: Any, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> Any:
    """No mask for a packed call (attention_mask None); SDPA's for a padded one."""
    if attention_mask is None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def _sdpa(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _check(sliding_window: Any, dropout: float) -> None:
    if sliding_window is not None:
        raise ConfigError(
            "trainer.packing does not support sliding-window attention layers; set "
            "trainer.packing = false for this model"
        )
    if dropout:
        raise ConfigError(
            f"packed attention has no dropout (the model's attention_dropout is {dropout}); "
            f"set trainer.packing = false or the model's attention_dropout to 0"
        )


def _rows_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: Any = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA per row of a packed call: query ``(1, H, N, D)``, output ``(1, N, H, D)``."""
    if cu_seq_lens_q is None:
        return _sdpa(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            sliding_window=sliding_window,
            **kwargs,
        )
    _check(sliding_window, dropout)
    bounds = cu_seq_lens_q.tolist()
    outs = [
        _causal_sdpa(query[:, :, start:end], key[:, :, start:end], value[:, :, start:end], scaling)
        for start, end in itertools.pairwise(bounds)
        if end > start
    ]
    out = torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]
    return out.transpose(1, 2).contiguous(), None


def _causal_sdpa(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float | None
) -> torch.Tensor:
    """SDPA's causal attention of one row, ``(1, H, n, D)`` in and out (fewer KV heads: GQA)."""
    return torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        is_causal=True,
        scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1],
    )


_VARLEN_PARAMS: frozenset[str] | None = None


def _varlen_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: Any = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    max_length_q: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """torch's varlen FlashAttention over a packed call (CUDA, bf16/fp16)."""
    if cu_seq_lens_q is None:
        return _sdpa(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            sliding_window=sliding_window,
            **kwargs,
        )
    _check(sliding_window, dropout)
    if cu_seq_lens_q.numel() == 2:  # one row (long ones fill a micro-batch alone)
        # SDPA's causal kernel: on an H200 it ran 16k-token rows faster than varlen
        # (a 1.5B step of 8 such rows: 4.04 s padded against 4.78 s packed, eager).
        return _causal_sdpa(query, key, value, scaling).transpose(1, 2).contiguous(), None
    # The rotary embedding leaves q and k in fp32 under autocast; FlashAttention needs 16 bits.
    dtype = query.dtype
    if dtype == torch.float32:
        dtype = (
            torch.get_autocast_dtype("cuda")
            if torch.is_autocast_enabled("cuda")
            else torch.bfloat16
        )
    q = query[0].transpose(0, 1).to(dtype)  # (N, H, D)
    k = key[0].transpose(0, 1).to(dtype)
    v = value[0].transpose(0, 1).to(dtype)
    cu = cu_seq_lens_q.to(torch.int32)
    length = int(max_length_q) if max_length_q is not None else int((cu[1:] - cu[:-1]).max())
    out = _varlen_call(q, k, v, cu, length, scaling)
    return out.unsqueeze(0), None  # (1, N, H, D)


@torch.compiler.disable
def _varlen_call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu: torch.Tensor,
    length: int,
    scaling: float | None,
) -> torch.Tensor:
    """The kernel call, left out of ``trainer.compile``'s graphs (the layer's graph breaks
    around it: torch's varlen op is not traced, whatever the torch version)."""
    global _VARLEN_PARAMS
    from torch.nn.attention.varlen import varlen_attn

    if _VARLEN_PARAMS is None:
        _VARLEN_PARAMS = frozenset(inspect.signature(varlen_attn).parameters)
    extra: dict[str, Any] = {"scale": scaling}
    if q.shape[1] != k.shape[1] and "enable_gqa" in _VARLEN_PARAMS:
        extra["enable_gqa"] = True  # (torch before 2.13 passes fewer KV heads as they are)
    if "is_causal" in _VARLEN_PARAMS:
        extra["is_causal"] = True
    else:
        extra["window_size"] = (-1, 0)  # causal
    return varlen_attn(q, k, v, cu, cu, length, length, **extra)

"""The trainer's GPU paths, checked on CPU against the fp32 padded step they replace.

Packing (rows side by side without padding, attention within a row), the chunked LM-head
logprob, gradient checkpointing, activation offload and bf16 autocast must train the
same step as the fp32 padded path: the same loss and the same gradients, within
rounding. Tolerances: fp32 paths, gradients within 1e-5 of the largest gradient entry of
each tensor and the loss within 1e-6 relative (measured: ~1e-6 and ~1e-9); bf16, per
tensor a gradient cosine similarity of at least 0.99 and a gradient norm within 5 %
(measured: cosine >= 0.999, norm within 1.2 %), and logprobs within 0.1 nats of fp32 on
average (bf16 rounds logits to 8 bits of mantissa).

Also: where the trainer lands (``trainer.device``) and what an out-of-memory step says.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from agentrl.config import LoraConfig, LossConfig, TrainerConfig
from agentrl.errors import ConfigError
from agentrl.trainer.batch import micro_batches, packed_micro_batches, rows_from_groups
from agentrl.trainer.losses import importance_weights
from agentrl.trainer.models import compile_layers
from agentrl.trainer.placement import TrainerMemoryError, resolve_device, resolve_precision
from agentrl.trainer.trainer import Trainer
from tests.trainer.test_checkpoint import synthetic_groups

FP32_GRAD = 1e-5
FP32_LOSS = 1e-6
LOSS_SCALE = 1e-2
"""The loss is a mean of per-token terms of order 1 that cancel to about 1e-3, so its fp32
rounding follows the terms, not the result: FP32_LOSS is relative to at least this. (With
a floor of 1e-3, packed and padded differed by 1.2e-9 against a bound of 1e-9 on an
AVX-512 CPU with torch 2.13, the tree before this change too.)"""
BF16_COSINE = 0.99
BF16_NORM = 0.05
BF16_LOGPROB = 0.1


def _step(model: Path, **settings: object) -> tuple[Trainer, object, dict[str, torch.Tensor]]:
    loss = settings.pop("loss", LossConfig("grpo"))
    config = TrainerConfig(lr=1e-3, micro_batch_tokens=40, loss=loss, **settings)  # type: ignore[arg-type]
    trainer = Trainer(str(model), config, temperature=0.9, seed=0)
    stats = trainer.train_step(synthetic_groups(4, groups=3, size=4))
    grads = {k: p.grad.clone() for k, p in trainer.model.named_parameters() if p.grad is not None}
    return trainer, stats, grads


def _worst(grads: dict[str, torch.Tensor], base: dict[str, torch.Tensor]) -> float:
    assert grads.keys() == base.keys() and base
    return max(
        ((grads[k] - base[k]).abs().max() / (base[k].abs().max() + 1e-12)).item() for k in base
    )


FP32_PATHS = {
    "packed": {"packing": True},
    "chunked": {"chunked_logprob": True},
    "packed+chunked": {"packing": True, "chunked_logprob": True},
    "packed+chunked+checkpointing": {
        "packing": True,
        "chunked_logprob": True,
        "gradient_checkpointing": True,
    },
    "packed+offload": {"packing": True, "activation_offload": True},
}


@pytest.mark.parametrize("loss", ["grpo", "dapo", "gspo+geo"])
@pytest.mark.parametrize("path", list(FP32_PATHS))
def test_fp32_paths_train_the_padded_step(tiny_model: Path, path: str, loss: str) -> None:
    kind = (
        LossConfig("grpo", ratio_level="sequence", geo_mask_low=0.5, geo_mask_high=2.0)
        if loss == "gspo+geo"
        else LossConfig(loss)
    )
    _base, base_stats, base_grads = _step(tiny_model, loss=kind)
    trainer, stats, grads = _step(tiny_model, loss=kind, **FP32_PATHS[path])
    assert trainer.precision == "fp32"
    assert trainer.packing == ("packed" in path)
    if "checkpointing" in path:
        assert trainer.model.is_gradient_checkpointing
    assert stats.tokens == base_stats.tokens and stats.sequences == base_stats.sequences
    assert abs(stats.loss - base_stats.loss) <= FP32_LOSS * max(abs(base_stats.loss), LOSS_SCALE)
    assert _worst(grads, base_grads) < FP32_GRAD
    assert stats.grad_norm == pytest.approx(base_stats.grad_norm, rel=1e-5)
    assert stats.logprob_gap_fresh == pytest.approx(base_stats.logprob_gap_fresh, rel=1e-5)


@pytest.mark.parametrize("path", ["bf16", "bf16+packed+chunked"])
def test_bf16_paths_train_nearly_the_padded_step(tiny_model: Path, path: str) -> None:
    extra = {"packing": True, "chunked_logprob": True} if "packed" in path else {}
    base, base_stats, base_grads = _step(tiny_model)
    trainer, stats, grads = _step(tiny_model, precision="bf16", **extra)
    assert trainer.precision == "bf16"
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters()), "fp32 master weights"
    state = trainer.optimizer.state_dict()["state"]
    assert all(
        v.dtype == torch.float32
        for s in state.values()
        for v in s.values()
        if torch.is_tensor(v) and v.numel() > 1
    )
    for k, g in base_grads.items():
        cos = torch.nn.functional.cosine_similarity(grads[k].flatten(), g.flatten(), dim=0)
        assert cos > BF16_COSINE, (k, float(cos))
    assert stats.grad_norm == pytest.approx(base_stats.grad_norm, rel=BF16_NORM)
    # the logprobs themselves, on the tokens the loss covers
    rows = rows_from_groups(synthetic_groups(4, groups=3, size=4))
    mb = (packed_micro_batches if extra else micro_batches)(rows, 10_000)[0]
    trainer.model.load_state_dict(base.model.state_dict())  # the same weights, its own head
    with torch.no_grad():
        low = trainer.logprobs(trainer.model, mb)
        base.precision = "fp32"
        base.packing = False
        high = base.logprobs(base.model, micro_batches(rows, 10_000)[0] if extra else mb)
    on = mb.mask > 0
    gap = (low - high)[on].abs().mean().item()
    print(f"\n{path}: mean |bf16 - fp32| logprob on {int(on.sum())} tokens: {gap:.4f}")
    assert 0 < gap < BF16_LOGPROB


def test_packed_batches_keep_rows_apart_and_match_padded_logprobs(tiny_model: Path) -> None:
    rows = rows_from_groups(synthetic_groups(5, groups=2, size=3))
    budget = 30
    packed = packed_micro_batches(rows, budget)
    assert sorted(len(r.trajectory) for r in rows) == sorted(
        int(n) for mb in packed for n in (mb.packed.cu_seqlens[1:] - mb.packed.cu_seqlens[:-1])
    ), "every row once"
    assert all(mb.packed.input_ids.shape[1] <= budget for mb in packed)
    own = sum(len(r.trajectory) for r in rows)
    assert sum(mb.model_tokens for mb in packed) == own, "no padding: the rows' own tokens"
    assert len({len(r.trajectory) for r in rows}) > 1, "rows of several lengths"
    assert sum(mb.model_tokens for mb in micro_batches(rows, budget)) > own, "padding pads"
    for mb in packed:
        p = mb.packed
        bounds = p.cu_seqlens.tolist()
        for start, end in itertools.pairwise(bounds):
            assert p.position_ids[0, start:end].tolist() == list(range(end - start))
        assert int(p.select.sum()) == int(mb.mask.sum()), "the loss's tokens, once each"
    trainer = Trainer(str(tiny_model), TrainerConfig(packing=True), temperature=1.0, seed=0)
    (one_padded,) = micro_batches(rows, 10_000)
    (one_packed,) = packed_micro_batches(rows, 10_000)
    with torch.no_grad():
        packed_lp = trainer.logprobs(trainer.model, one_packed)
        trainer.packing = False
        padded_lp = trainer.logprobs(trainer.model, one_padded)
    on = one_padded.mask > 0
    assert torch.equal(one_packed.mask, one_padded.mask)
    assert (packed_lp - padded_lp)[on].abs().max() < 1e-5


def test_flex_attention_packed_forward_matches_rows(tiny_model: Path) -> None:
    """transformers' flex_attention (a GPU option) reads the same packed batch: its
    forward runs on CPU (its backward does not), and gives the rows' logprobs."""
    from agentrl.trainer import packing

    rows = rows_from_groups(synthetic_groups(6, groups=2, size=3))
    (mb,) = packed_micro_batches(rows, 10_000)
    trainer = Trainer(str(tiny_model), TrainerConfig(packing=True), temperature=1.0, seed=0)
    assert trainer.attention == packing.ROWS
    with torch.no_grad():
        rows_lp = trainer.logprobs(trainer.model, mb)
        trainer.model.set_attn_implementation("flex_attention")
        flex_lp = trainer.logprobs(trainer.model, mb)
    assert (rows_lp - flex_lp)[mb.mask > 0].abs().max() < 1e-5


def test_varlen_attention_of_one_row_is_the_rows_attention() -> None:
    """A packed micro-batch of one row takes SDPA's causal kernel, not varlen's (faster
    there on an H200): the same output as the per-row path, runnable on CPU."""
    from agentrl.trainer import packing

    torch.manual_seed(0)
    n, heads, kv_heads, dim = 37, 4, 2, 8
    query = torch.randn(1, heads, n, dim)
    key, value = torch.randn(1, kv_heads, n, dim), torch.randn(1, kv_heads, n, dim)
    cu = torch.tensor([0, n], dtype=torch.int32)
    varlen, _ = packing._varlen_attention(
        None, query, key, value, None, scaling=0.3, cu_seq_lens_q=cu, max_length_q=n
    )
    rows, _ = packing._rows_attention(None, query, key, value, None, scaling=0.3, cu_seq_lens_q=cu)
    assert varlen.shape == (1, n, heads, dim)
    assert torch.equal(varlen, rows)
    causal = varlen[0, 0]  # the first token sees only itself: its value, per GQA group
    assert torch.allclose(causal, value[0, :, 0].repeat_interleave(heads // kv_heads, 0))


def test_packed_chunked_lora_and_reference_model(tiny_model: Path) -> None:
    lora = LoraConfig(enabled=True, r=4)
    fast = {"packing": True, "chunked_logprob": True}
    for settings in ({"lora": lora}, {"loss": LossConfig("grpo", beta=0.05)}):
        _, base_stats, base_grads = _step(tiny_model, **settings)
        _, stats, grads = _step(tiny_model, **settings, **fast)
        assert _worst(grads, base_grads) < FP32_GRAD
        assert stats.kl == pytest.approx(base_stats.kl, rel=1e-4, abs=1e-9)


def test_device_auto_is_the_cpu_here_and_cuda_without_cuda_is_refused(tiny_model: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    trainer = Trainer(str(tiny_model), TrainerConfig(), temperature=1.0, seed=0)
    assert trainer.device == torch.device("cpu") and trainer.precision == "fp32"
    assert not trainer.packing and not trainer.chunked_logprob, "CPU defaults stay as before"
    assert all(p.device.type == "cpu" for p in trainer.model.parameters())
    assert trainer.placement().startswith("trainer on cpu (")
    assert resolve_precision("auto", torch.device("cpu")) == "fp32"
    for setting in ("cuda", "cuda:1"):
        with pytest.raises(ConfigError, match="CUDA is not available"):
            resolve_device(setting)
        with pytest.raises(ConfigError, match=r"trainer\.device"):
            Trainer(str(tiny_model), TrainerConfig(device=setting), temperature=1.0, seed=0)
    with pytest.raises(ConfigError, match=r"trainer\.device = 'gpu' is not allowed"):
        TrainerConfig(device="gpu")
    with pytest.raises(ConfigError, match=r"trainer\.precision"):
        TrainerConfig(precision="fp16")
    with pytest.raises(ConfigError, match="varlen"):
        Trainer(
            str(tiny_model),
            TrainerConfig(packing=True, packed_attention="varlen"),
            temperature=1.0,
            seed=0,
        )


def test_agentrl_train_is_told_which_gpu_settings_measured_slow(tiny_model: Path) -> None:
    trainer = Trainer(str(tiny_model), TrainerConfig(), temperature=1.0, seed=0)
    assert trainer.advice() == [], "nothing to say on CPU"
    trainer._device = torch.device("cuda", 0)  # all the advice reads of the device
    ((level, budget),) = trainer.advice()
    assert level == "note", "the default's: said, not warned"
    assert "trainer.micro_batch_tokens = 4096" in budget and "gradient_checkpointing" in budget
    trainer.config = dataclasses.replace(trainer.config, compile=True)
    assert [(level, line.split(" ")[0]) for level, line in trainer.advice()] == [
        ("note", "trainer.micro_batch_tokens"),
        ("warning", "trainer.compile"),
    ]
    trainer.config = dataclasses.replace(trainer.config, micro_batch_tokens=32_768)
    assert trainer.advice() == [], "the measured recipe"


def test_out_of_memory_names_the_settings_that_fit(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = Trainer(
        str(tiny_model), TrainerConfig(micro_batch_tokens=2048), temperature=1.0, seed=0
    )

    def oom(groups: object) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(trainer, "_train_step", oom)
    with pytest.raises(TrainerMemoryError) as info:
        trainer.train_step(synthetic_groups(0))
    text = str(info.value)
    for setting in (
        "trainer.lora.enabled = true",
        "trainer.gradient_checkpointing = true",
        "trainer.micro_batch_tokens (now 2048",
        "in step 1",
    ):
        assert setting in text, text
    assert isinstance(info.value, ConfigError)


def test_packing_does_not_change_the_step_across_budgets(tiny_model: Path) -> None:
    """The loss is normalised over the whole step: how rows are packed does not matter."""
    groups = synthetic_groups(7, groups=3, size=4)
    out = []
    for budget in (16, 40, 10_000):
        config = TrainerConfig(
            lr=1e-3, micro_batch_tokens=budget, packing=True, loss=LossConfig("dapo")
        )
        trainer = Trainer(str(tiny_model), config, temperature=1.0, seed=0)
        trainer.train_step(groups)
        out.append(
            np.concatenate([p.detach().flatten().numpy() for p in trainer.model.parameters()])
        )
    # Adam's first step is about lr * sign(grad): summation-order noise shows as ~1e-3 of lr
    assert max(np.abs(o - out[-1]).max() for o in out[:-1]) < 1e-2 * 1e-3


def test_compiled_layers_train_the_padded_step(tiny_model: Path) -> None:
    """trainer.compile with packing and checkpointing (the fastest H200 recipe) trains the
    eager padded step; on CPU the packed attention runs per row, on a GPU varlen."""
    _base, base_stats, base_grads = _step(tiny_model)
    trainer, stats, grads = _step(
        tiny_model, compile=True, packing=True, gradient_checkpointing=True
    )
    layers = trainer.model.model.layers
    assert all(layer._compiled_call_impl is not None for layer in layers), "every layer compiled"
    assert "compiled layers" in trainer.placement()
    assert stats.tokens == base_stats.tokens
    # inductor fuses and reorders the fp32 arithmetic: measured 2.2e-6 of the loss
    assert abs(stats.loss - base_stats.loss) <= 10 * FP32_LOSS * max(abs(base_stats.loss), 1e-3)
    assert _worst(grads, base_grads) < FP32_GRAD
    assert stats.grad_norm == pytest.approx(base_stats.grad_norm, rel=1e-5)


def test_compile_names_the_setting_when_a_model_has_no_decoder_layers() -> None:
    with pytest.raises(ConfigError, match=r"trainer.compile = true .*Linear.*compile = false"):
        compile_layers(torch.nn.Linear(2, 2))


def test_step_statistics_equal_a_direct_computation(tiny_model: Path) -> None:
    """The statistics a step reports (kept on the device per micro-batch and read once)
    equal the same quantities computed directly from the policy's logprobs before it."""
    groups = synthetic_groups(4, groups=3, size=4)
    for g, group in enumerate(groups):  # stale (version 0) and fresh (version 2) rows
        group.trajectories[:] = [
            dataclasses.replace(t, versions=np.where(t.loss_mask == 1, 2 if (g + i) % 2 else 0, -1))
            for i, t in enumerate(group.trajectories)
        ]
    config = TrainerConfig(lr=1e-3, micro_batch_tokens=40)
    trainer = Trainer(str(tiny_model), config, temperature=0.9, seed=0)
    trainer.set_version(2)
    w, staleness, gap = [], [], []
    for old, mb in trainer.score(groups):
        on = mb.mask.bool()
        weights = importance_weights(
            old,
            mb.behaviour_logprobs,
            mb.mask,
            config.loss.correction,
            config.loss.correction_min,
            config.loss.correction_max,
        )
        w.append(weights.expand_as(mb.mask)[on])
        staleness.append((2 - mb.versions)[on].float())
        fresh = on & (mb.versions == 2)
        gap.append((old - mb.behaviour_logprobs)[fresh].abs())
    assert len(w) > 2, "several micro-batches"
    w, staleness, gap = torch.cat(w), torch.cat(staleness), torch.cat(gap)
    stats = trainer.train_step(groups)
    assert stats.tokens == len(w)
    assert (stats.staleness_min, stats.staleness_max) == (0.0, 2.0)
    assert stats.staleness_mean == pytest.approx(float(staleness.mean()), rel=1e-6)
    assert stats.is_weight_min == pytest.approx(float(w.min()), rel=1e-6)
    assert stats.is_weight_max == pytest.approx(float(w.max()), rel=1e-6)
    assert stats.is_weight_mean == pytest.approx(float(w.mean()), rel=1e-6)
    assert stats.fresh_tokens == len(gap) and 0 < len(gap) < len(w)
    assert stats.logprob_gap_fresh == pytest.approx(float(gap.mean()), rel=1e-5)

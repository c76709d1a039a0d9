"""One GPU for the trainer and vLLM: the start-time budget, and vLLM asleep during steps.

The budget (:func:`agentrl.trainer.placement.colocated_plan`) is checked on model shapes
of the real Qwen2.5 sizes (built on the meta device: no weights) against an H200's
memory: what fits, what does not, and that the error names the settings that would make
it fit and the plan then fits. The sleep protocol (``inference.sleep_during_train``) is
checked on CPU through the train loop with a recording engine: vLLM sleeps before the
step, wakes after it (also when the step fails) and before the weights are published.
vLLM's own sleep mode needs a GPU; on one, ``agentrl train`` uses
:class:`~agentrl.inference.engine.VLLMEngineClient`'s ``sleep``/``wake_up`` (not run here).
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from agentrl.config import InferenceConfig, LoraConfig, RunConfig, TrainerConfig
from agentrl.config.sections import TrainConfig
from agentrl.errors import ConfigError
from agentrl.protocols import UpdateStats
from agentrl.trainer.placement import colocated_error, colocated_plan
from agentrl.trainer.publish import PublishStats
from agentrl.trainer.trainer import Trainer
from tests.trainer.test_checkpoint import synthetic_groups

H200 = int(139.8 * 2**30)
SHAPES = {  # Qwen2.5-0.5B and 1.5B (tied embeddings)
    "0.5b": {
        "hidden_size": 896,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "intermediate_size": 4864,
    },
    "1.5b": {
        "hidden_size": 1536,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "intermediate_size": 8960,
    },
}


def _shape(name: str) -> tuple[Any, int]:
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(vocab_size=151_936, tie_word_embeddings=True, **SHAPES[name])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return config, sum(p.numel() for p in model.parameters())


def _plan(name: str, trainer: TrainerConfig, inference: InferenceConfig) -> Any:
    config, params = _shape(name)
    return colocated_plan(
        config, params, trainer, inference, precision="bf16", chunked=True, total=H200
    )


def test_the_budget_of_real_shapes_on_one_h200() -> None:
    _, params = _shape("0.5b")
    assert 490e6 < params < 500e6  # Qwen2.5-0.5B: 494M with tied embeddings
    small = _plan(
        "0.5b",
        TrainerConfig(micro_batch_tokens=16_384),
        InferenceConfig(dtype="bfloat16", kv_cache_mib=8192),
    )
    assert small.fits(), small.describe()
    assert small.trainer_static == params * 16
    assert small.vllm == params * 2 + 8192 * 2**20 + 2**30
    # 1.5B, full fine-tuning, 16k-token micro-batches, vLLM asking for most of the GPU: no
    trainer = TrainerConfig(micro_batch_tokens=16_384)
    greedy = InferenceConfig(dtype="bfloat16", gpu_memory_utilization=0.6)
    big = _plan("1.5b", trainer, greedy)
    assert not big.fits(), big.describe()
    text = str(colocated_error(big, trainer, greedy))
    for setting in (
        "inference.gpu_memory_utilization (now 0.6)",
        "inference.sleep_during_train = true",
        "trainer.lora.enabled = true",
        "trainer.gradient_checkpointing = true",
        "trainer.micro_batch_tokens (now 16384)",
    ):
        assert setting in text, text
    # each named fix is real: sleeping, or checkpointing, makes this one fit
    assert _plan("1.5b", trainer, dataclasses.replace(greedy, sleep_during_train=True)).fits()
    checkpointed = dataclasses.replace(trainer, gradient_checkpointing=True)
    assert _plan("1.5b", checkpointed, greedy).fits()
    lora = dataclasses.replace(trainer, lora=LoraConfig(enabled=True))
    assert _plan("1.5b", lora, greedy).trainer_static == _shape("1.5b")[1] * 4


def test_full_logits_and_fp32_cost_what_the_plan_says() -> None:
    config, params = _shape("0.5b")
    trainer, inference = TrainerConfig(micro_batch_tokens=8192), InferenceConfig()
    chunked = colocated_plan(
        config, params, trainer, inference, precision="bf16", chunked=True, total=H200
    )
    full = colocated_plan(
        config, params, trainer, inference, precision="bf16", chunked=False, total=H200
    )
    fp32 = colocated_plan(
        config, params, trainer, inference, precision="fp32", chunked=True, total=H200
    )
    assert full.trainer_activations - chunked.trainer_activations == 2 * 8192 * 151_936 * 2
    weights = 2 * params  # autocast's bf16 copy
    assert fp32.trainer_activations / (chunked.trainer_activations - weights) == pytest.approx(
        135 / 80
    )


# First-step peaks measured on an H200 by benchmarks/bench_trainer.py (2026-12-04,
# benchmarks/results/trainer_cuda_h200.md), GiB: (shape, micro-batch tokens, precision,
# chunked logprob, peak). A later step also holds AdamW's two moments (made at the end of
# the first), so its peak is this plus 8 bytes a parameter.
H200_FIRST_STEP_PEAKS = [
    ("0.5b", 8192, "fp32", False, 34.79),  # padded
    ("0.5b", 8192, "bf16", False, 22.51),  # padded
    ("0.5b", 8192, "bf16", True, 17.45),  # packed
    ("0.5b", 16_384, "bf16", True, 29.77),
    ("1.5b", 16_384, "bf16", True, 69.88),
]


@pytest.mark.parametrize(
    ("shape", "tokens", "precision", "chunked", "first"), H200_FIRST_STEP_PEAKS
)
def test_the_trainer_estimate_is_within_a_tenth_of_the_h200_measurements(
    shape: str, tokens: int, precision: str, chunked: bool, first: float
) -> None:
    """The plan's trainer memory (held + per step) against what a step held on an H200,
    so that a start-time 'it fits' is not an out-of-memory error at the first step."""
    config, params = _shape(shape)
    plan = colocated_plan(
        config,
        params,
        TrainerConfig(micro_batch_tokens=tokens),
        InferenceConfig(),
        precision=precision,
        chunked=chunked,
        total=H200,
    )
    measured = first * 2**30 + 8 * params
    estimate = plan.trainer_static + plan.trainer_activations
    assert abs(estimate / measured - 1) < 0.1, (estimate / 2**30, measured / 2**30)


@pytest.mark.parametrize(
    ("override", "needs"),
    [
        ('--train.mode="async"', "train.mode = 'sync'"),
        ('--inference.mode="server"', "inference.mode = 'engine'"),
        ("--eval.every=2 --eval.episodes=8", "eval.every = 0"),
    ],
)
def test_sleep_during_train_needs_sync_engine_and_no_eval_beside(override: str, needs: str) -> None:
    base = [
        '--env.id="agentrl/Digits-v0"',
        "--inference.sleep_during_train=true",
        '--train.mode="sync"',
    ]
    RunConfig.load(None, base).check()  # the right combination is accepted
    with pytest.raises(ConfigError, match=f"sleep_during_train needs {needs}"):
        RunConfig.load(None, [*base, *override.split()]).check()
    with pytest.raises(ConfigError, match=r"gpu_memory_utilization = 1.5"):
        InferenceConfig(gpu_memory_utilization=1.5)


class _Engine:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    async def sleep(self) -> None:
        self.events.append("sleep")

    async def wake_up(self) -> None:
        self.events.append("wake")


def test_the_loop_puts_vllm_to_sleep_for_each_step(tiny_model: Path) -> None:
    from agentrl.run_start import EngineSleep
    from agentrl.trainer.loop import TrainLoop

    events: list[str] = []
    trainer = Trainer(str(tiny_model), TrainerConfig(), temperature=1.0, seed=0)
    step = trainer.train_step

    def train_step(groups: Any) -> Any:
        events.append("train")
        if len(events) > 4:
            raise RuntimeError("a failing step")
        return step(groups)

    trainer.train_step = train_step  # type: ignore[method-assign]

    class Publisher:
        async def publish(self) -> PublishStats:
            events.append("publish")
            update = UpdateStats(trainer.version + 1, "resume", "test", 0, 0, 0, 0, 0, 0, 0, 0)
            trainer.set_version(update.version)
            return PublishStats(update.version, "full", 0, 0.0, update)

    class Scheduler:
        async def notify_version(self) -> None:
            pass

        def generation_idle(self) -> bool:
            return True

    class Sleep(EngineSleep):
        async def wake_up(self) -> None:  # the real one also empties torch's CUDA cache
            await self.engine.wake_up()

    loop = TrainLoop(
        trainer,
        Publisher(),
        Scheduler(),
        None,  # type: ignore[arg-type]
        TrainConfig(mode="sync", checkpoint_every=0),
        sleeper=Sleep(_Engine(events)),
    )
    asyncio.run(loop._train(synthetic_groups(0)))
    assert events == ["sleep", "train", "wake", "publish"]
    with pytest.raises(RuntimeError, match="a failing step"):
        asyncio.run(loop._train(synthetic_groups(1)))
    assert events[4:] == ["sleep", "train", "wake"], "awake again after a failed step"

"""The trainer benchmark's workload: a model of a chosen shape and one step's rows.

A random-weight Qwen2 model (:data:`SHAPES`: Qwen2.5's 0.5B and 1.5B shapes with tied
embeddings, or a small one for a CPU) cached by shape with the project's byte-level
tokenizer (:func:`build_model`), and synthetic multi-turn rows (:data:`CASES`,
:func:`synthetic_groups`): a prompt, then assistant turns (trained) alternating with tool
and env turns, in groups of :data:`GROUP_SIZE`. Used by ``benchmarks/bench_trainer.py``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

GROUP_SIZE = 8


@dataclasses.dataclass(frozen=True, slots=True)
class Shape:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    mlp: int


SHAPES = {
    "small": Shape(vocab=4096, hidden=256, layers=4, heads=4, kv_heads=2, mlp=1024),
    "0.5b": Shape(vocab=151_936, hidden=896, layers=24, heads=14, kv_heads=2, mlp=4864),
    "1.5b": Shape(vocab=151_936, hidden=1536, layers=28, heads=12, kv_heads=2, mlp=8960),
}


@dataclasses.dataclass(frozen=True, slots=True)
class Case:
    rows: int
    mean_tokens: int
    spread: float
    """Row lengths are uniform in mean x (1 - spread) .. mean x (1 + spread)."""
    micro_batch_tokens: int
    """``trainer.micro_batch_tokens`` (padded tokens; packed: the rows' own)."""


CASES = {
    "64x1k": Case(rows=64, mean_tokens=960, spread=0.5, micro_batch_tokens=8192),
    "8x16k": Case(rows=8, mean_tokens=16384, spread=0.25, micro_batch_tokens=16384),
    "16x256": Case(rows=16, mean_tokens=256, spread=0.5, micro_batch_tokens=2048),
    "4x2k": Case(rows=4, mean_tokens=2048, spread=0.25, micro_batch_tokens=8192),
}
DEFAULT_CASE = {"cuda": "64x1k", "cpu": "16x256"}
DEFAULT_SHAPE = {"cuda": "0.5b", "cpu": "small"}


def model_config(shape: Shape) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        intermediate_size=shape.mlp,
        max_position_embeddings=32768,
        rope_theta=1e6,
        tie_word_embeddings=True,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=0,
    )


def matmul_parameters(shape: Shape) -> tuple[int, int]:
    """(all parameters, those a token goes through a matmul of), counted on the meta device."""
    import torch
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        model = Qwen2ForCausalLM(model_config(shape))
    total = sum(p.numel() for p in model.parameters())  # the tied head once
    embedding = model.get_input_embeddings().weight
    tied = model.get_output_embeddings().weight is embedding
    return total, total if tied else total - embedding.numel()  # a lookup is no matmul


def build_model(name: str, shape: Shape, device: str) -> Path:
    """A random-weight model of ``shape`` and the tiny tokenizer, cached by shape."""
    import torch
    from transformers import Qwen2ForCausalLM

    from agentrl.models.tiny import TinyModelConfig, build_tokenizer, default_cache_dir

    key = hashlib.sha256(json.dumps(dataclasses.asdict(shape)).encode()).hexdigest()[:10]
    parent = default_cache_dir()
    target = parent / f"bench-trainer-{name}-{key}"
    if (target / "model.safetensors").is_file() and (target / "tokenizer.json").is_file():
        return target
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=parent))
    try:
        build_tokenizer(TinyModelConfig()).save_pretrained(staging)
        state = torch.random.get_rng_state()
        torch.manual_seed(0)
        try:
            with torch.device(device):  # a GPU initialises 1.5B weights in a second
                model = Qwen2ForCausalLM(model_config(shape)).to(torch.float32)
        finally:
            torch.random.set_rng_state(state)
        model.save_pretrained(staging)
        del model
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _spans(rng: np.random.Generator, n: int) -> list[tuple[str, int]]:
    """(kind, length) runs of one row of ``n`` tokens: a prompt, then assistant turns
    alternating with tool/env results, ending on an assistant turn."""
    runs = [("prompt", int(np.clip(n * rng.uniform(0.1, 0.2), 8, 2048)))]
    left = n - runs[0][1]
    while left > 0:
        reply = int(np.clip(n * rng.uniform(0.02, 0.08), 4, 512))
        result = int(np.clip(n * rng.uniform(0.03, 0.15), 4, 2048))
        if reply + result + 4 >= left:  # the last turn is the assistant's
            runs.append(("assistant", left))
            break
        runs += [("assistant", reply), (str(rng.choice(["tool", "env"])), result)]
        left -= reply + result
    return runs


def _trajectory(rng: np.random.Generator, name: str, n: int, vocab: int) -> Any:
    from agentrl.types import TokenSpan, Trajectory

    spans, mask, start, turn = [], [], 0, 0
    for kind, length in _spans(rng, n):
        spans.append(TokenSpan(kind, start, start + length, turn))  # type: ignore[arg-type]
        mask.append(np.full(length, kind == "assistant", dtype=np.int8))
        start += length
        turn += kind == "assistant"
    loss_mask = np.concatenate(mask)
    on = loss_mask == 1
    # near a random model's own logprob (-ln V), as vLLM's would be for these weights
    behaviour = np.minimum(-math.log(vocab) + rng.normal(0.0, 0.05, n), 0.0)
    return Trajectory(
        episode_id=name,
        task_id=name.split("/")[0],
        env_id="bench",
        seed=0,
        token_ids=rng.integers(10, vocab, n),
        loss_mask=loss_mask,
        logprobs=np.where(on, behaviour, np.nan),
        versions=np.where(on, 0, -1),
        spans=tuple(spans),
        messages=[],
        turn_rewards=[0.0],
        reward=float(rng.random()),
        status="finished",
    )


def synthetic_groups(case: Case, vocab: int, seed: int = 0) -> list[Any]:
    """``case.rows`` multi-turn rows in groups of up to 8, the same for a given seed."""
    from agentrl.types import Group, Task

    rng = np.random.default_rng(seed)
    low, high = case.mean_tokens * (1 - case.spread), case.mean_tokens * (1 + case.spread)
    lengths = rng.integers(int(low), int(high) + 1, case.rows)
    groups = []
    for g, first in enumerate(range(0, case.rows, GROUP_SIZE)):
        chunk = lengths[first : first + GROUP_SIZE]
        rows = [_trajectory(rng, f"t{g}/{i}", int(n), vocab) for i, n in enumerate(chunk)]
        groups.append(Group(Task(f"t{g}", "bench", g), len(rows), rows))
    return groups

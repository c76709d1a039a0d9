"""A tiny model that writes a family's tool-call format, for the real-vLLM family tests.

:func:`build_family_model` makes a folder that vLLM loads: the family's fixture tokenizer
with its real chat template (:mod:`tests.models.families`) and a tiny Llama-architecture
model taught one episode on CPU. The episode is the token record the runner makes when
the model calls ``add(a=2, b=3)`` in the family's format and then answers ``Answer: 5``
(run first with scripted output). The fit stops once every sampled token of that record
is the model's greedy choice by a clear logit margin, so that vLLM's greedy sampling,
with its own CPU kernels, writes the same tokens: a few dozen Adam steps, seconds. The
generation config stops at the family's end-of-turn token, as the real model's does.

The folder is built once per cache folder (``taught.json`` is written last).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from agentrl.config import ModelConfig
from tests.models.families import CALLS, Family, build_tokenizer, run_episode, thinking

SETTINGS = ModelConfig(chat_template_kwargs={"date_string": "26 Jul 2024"})
"""How the taught episode is rendered, and must be again: Llama 3's template writes today's
date into the system prompt unless ``date_string`` is given (other templates ignore it)."""
MARGIN = 4.0
"""Logit margin of every taught token over the runner-up (float32 kernels differ far less)."""
MAX_STEPS = 300


@dataclasses.dataclass(frozen=True)
class TaughtModel:
    family: Family
    path: Path
    token_ids: list[int]
    """The episode's token record the model was taught (prompt, sampled and rendered)."""


def build_family_model(
    fam: Family, parent: Path, *, env_id: str = "tests/FamilyAdd-v0"
) -> TaughtModel:
    """The taught model of ``fam`` under ``parent`` (built if it is not there yet), taught
    the episode of ``env_id`` (AddEnv, or an env like it: the same task, its tools from
    elsewhere). Runs an event loop of its own: call it outside one (a sync fixture)."""
    tag = "" if env_id == "tests/FamilyAdd-v0" else "-" + env_id.replace("/", "-")
    folder = parent / f"family-{fam.name}{tag}"
    marker = folder / "taught.json"
    if marker.is_file():
        return TaughtModel(fam, folder, json.loads(marker.read_text())["token_ids"])
    tokenizer = build_tokenizer(fam)
    replies = [thinking(fam, CALLS[fam.tool_format]), thinking(fam, "Answer: 5")]
    (traj,), _, _ = asyncio.run(run_episode(tokenizer, fam, replies, model=SETTINGS, env_id=env_id))
    assert traj.status == "finished" and traj.reward == 1.0, traj.reason
    ids, mask = traj.token_ids.tolist(), traj.loss_mask.tolist()
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=parent))
    try:
        _fit(fam, tokenizer, ids, mask).save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / "taught.json").write_text(json.dumps({"token_ids": ids}))
        staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return TaughtModel(fam, folder, ids)


def _fit(fam: Family, tokenizer: Any, ids: list[int], mask: list[int]) -> Any:
    """A tiny Llama fit to predict every sampled token of ``ids`` (``mask`` = 1)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    eot = tokenizer.convert_tokens_to_ids(fam.eos)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,  # heads of 64
        max_position_embeddings=1024,
        initializer_range=0.1,
        tie_word_embeddings=False,  # vLLM's CPU reload keeps a tied head (see tiny.py)
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eot,
        pad_token_id=tokenizer.pad_token_id,
    )
    tokens = torch.tensor(ids, dtype=torch.long)
    taught = torch.tensor(mask[1:], dtype=torch.bool)
    inputs, targets = tokens[None, :-1], tokens[1:][taught]
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).to(torch.float32)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(MAX_STEPS):
        logits = model(inputs).logits[0][taught]
        loss = torch.nn.functional.cross_entropy(logits, targets)
        if _margin(logits.detach(), targets) >= MARGIN:
            break
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    else:
        raise AssertionError(f"{fam.name}: the fit did not reach a margin of {MARGIN}")
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=[eot],
        pad_token_id=tokenizer.pad_token_id,
    )
    return model


def _margin(logits: Any, targets: Any) -> float:
    """The smallest lead of a taught token's logit over the best other token."""
    at = targets[:, None]
    others = logits.scatter(1, at, float("-inf"))
    return float((logits.gather(1, at)[:, 0] - others.max(dim=-1).values).min())

"""Exported episodes read back as training data, tokens as recorded.

A native JSONL export read back trains an SFT step (:func:`agentrl.sft.warm_start` on
the tiny model) on examples whose tokens and loss mask equal the store's; the same
trajectories group by task as a training step takes them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from safetensors.numpy import load_file

from agentrl import replay
from agentrl.export import export_run, offline_groups, read_trajectories, sft_examples
from agentrl.sft import SFTSettings, warm_start
from agentrl.store import EpisodeStore
from tests.export.recorded_run import record_run

pytestmark = pytest.mark.timeout(300)


def test_native_export_trains_an_sft_step_on_the_recorded_tokens(
    tiny_model: Path, tokenizer: Any, tmp_path: Path
) -> None:
    run_dir = asyncio.run(record_run(tokenizer, tmp_path / "run"))
    with EpisodeStore.open(run_dir, create=False) as store:
        asyncio.run(export_run(store, "jsonl", tmp_path / "out" / "episodes.jsonl"))
        stored = [t for r in replay.select(store, state=["finished"]) for t in r.trajectories]
    back = [t for t in read_trajectories(tmp_path / "out" / "episodes.jsonl")
            if t.status == "finished"]  # fmt: skip
    examples = list(sft_examples(back))
    assert len(examples) == len(stored) == 7
    for example, t in zip(examples, stored, strict=True):
        assert example["input_ids"] == t.token_ids.tolist()
        assert example["assistant_masks"] == t.loss_mask.tolist()
    groups = offline_groups(back)
    assert sorted(len(g.trajectories) for g in groups) == [2, 2, 3]  # one task has a fork

    one_step = SFTSettings(steps=1, batch_size=2, lr=1e-2, warmup_ratio=0.0)
    out = warm_start(tiny_model, [(one_step, examples)], tmp_path / "sft")
    before = load_file(str(tiny_model / "model.safetensors"))
    after = load_file(str(out / "model.safetensors"))
    changed = [k for k in before if k in after and (before[k] != after[k]).any()]
    assert changed, "one SFT step on the read-back examples changed no weight"

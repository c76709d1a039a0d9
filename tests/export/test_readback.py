"""Exported episodes read back as training data, tokens as recorded.

* A native JSONL export read back trains an SFT step (:func:`agentrl.sft.warm_start` on
  the tiny model) on examples whose tokens and loss mask equal the store's; the same
  trajectories group by task as a training step takes them.
* An ATIF export read back trains an SFT step: the batch the model is given holds the
  recorded token ids, with labels exactly on the recorded loss mask.
* :func:`offline_groups` of an ATIF export (the same groups as of the native export)
  feed one real :meth:`Trainer.train_step`: the micro-batches it trains on hold the
  recorded token ids, loss mask, policy versions and behaviour logprobs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
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
    back = [
        t for t in read_trajectories(tmp_path / "out" / "episodes.jsonl") if t.status == "finished"
    ]
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


def test_offline_groups_feed_a_real_trainer_step_with_the_recorded_tokens(
    run_dir: Path, tiny_model: Path, tmp_path: Path
) -> None:
    from agentrl.config import TrainerConfig
    from agentrl.trainer.batch import MicroBatch
    from agentrl.trainer.trainer import Trainer

    with EpisodeStore.open(run_dir, create=False) as store:
        asyncio.run(export_run(store, "jsonl", tmp_path / "episodes.jsonl"))
        asyncio.run(export_run(store, "atif", tmp_path / "episodes.atif.jsonl"))
        stored = {
            (t.episode_id, t.attempt, t.segment): t
            for r in replay.select(store, state=["finished"])
            for t in r.trajectories
        }
    native = offline_groups(read_trajectories(tmp_path / "episodes.jsonl"))
    groups = offline_groups(read_trajectories(tmp_path / "episodes.atif.jsonl"))
    assert _shape(groups) == _shape(native)

    trainer = Trainer(str(tiny_model), TrainerConfig(lr=1e-3), temperature=1.0, seed=0)
    seen: list[MicroBatch] = []
    build = trainer.micro_batches

    def record(rows: Any) -> list[MicroBatch]:  # the micro-batches the step trains on
        batches = build(rows)
        seen.extend(batches)
        return batches

    trainer.micro_batches = record  # type: ignore[method-assign]
    stats = trainer.train_step(groups)
    keys = [key for mb in seen for key in mb.keys]
    assert stats.tokens > 0 and len(keys) == stats.sequences >= 4, (keys, stats)
    assert set(keys) <= set(stored)
    for mb in seen:
        for row, key in enumerate(mb.keys):
            t, n = stored[key], len(stored[key])
            assert mb.input_ids[row, :n].tolist() == t.token_ids.tolist(), key
            assert mb.targets[row, : n - 1].tolist() == t.token_ids[1:].tolist(), key
            assert mb.mask[row, : n - 1].tolist() == t.loss_mask[1:].tolist(), key
            assert mb.versions[row, : n - 1].tolist() == t.versions[1:].tolist(), key
            sampled = t.loss_mask[1:].astype(bool)
            behaviour = mb.behaviour_logprobs[row, : n - 1].numpy()[sampled]
            assert np.allclose(behaviour, t.logprobs[1:][sampled], atol=1e-6), key


def _shape(groups: list[Any]) -> list[tuple[Any, ...]]:
    return sorted(
        (g.task.task_id, g.size, t.episode_id, t.attempt, t.segment, t.token_ids.tolist())
        for g in groups
        for t in g.trajectories
    )


def test_atif_export_trains_an_sft_step_on_the_recorded_tokens(
    run_dir: Path, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers

    with EpisodeStore.open(run_dir, create=False) as store:
        asyncio.run(export_run(store, "atif", tmp_path / "episodes.atif.jsonl"))
        stored = [t for r in replay.select(store, state=["finished"]) for t in r.trajectories]
    back = [
        t for t in read_trajectories(tmp_path / "episodes.atif.jsonl") if t.status == "finished"
    ]
    examples = list(sft_examples(back))
    want = sorted((t.token_ids.tolist(), t.loss_mask.tolist()) for t in stored)
    assert sorted((e["input_ids"], e["assistant_masks"]) for e in examples) == want

    batches: list[dict[str, Any]] = []
    load = transformers.AutoModelForCausalLM.from_pretrained

    def load_and_watch(*args: Any, **kwargs: Any) -> Any:  # what each forward is given
        model = load(*args, **kwargs)
        model.register_forward_pre_hook(lambda _m, _a, kw: batches.append(kw), with_kwargs=True)
        return model

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", load_and_watch)
    one_step = SFTSettings(steps=1, batch_size=len(examples), lr=1e-2, warmup_ratio=0.0)
    out = warm_start(tiny_model, [(one_step, examples)], tmp_path / "sft")
    assert (out / "config.json").is_file()
    assert len(batches) == 1, [sorted(b) for b in batches]
    ids, labels = batches[0]["input_ids"], batches[0]["labels"]
    trained = []
    for row in range(ids.shape[0]):
        n = int(batches[0]["attention_mask"][row].sum())
        trained.append((ids[row, :n].tolist(), (labels[row, :n] != -100).int().tolist()))
    assert sorted(trained) == want, "the SFT step did not train on the recorded tokens"

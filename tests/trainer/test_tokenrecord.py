"""The trainer's per-token record, from a real optimizer step of the tiny model on CPU:
one record per trained trajectory, aligned to its tokens, holding the logprobs the
trainer computed, the advantages it used, weights on every sampled token and no mask
outside them; nothing for rows it did not train; off with ``recorder=None``."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from agentrl.config import TrainerConfig
from agentrl.trainer.batch import rows_from_groups
from agentrl.trainer.tokenrecord import RECORD_FILE, TokenRecorder, read_record
from agentrl.trainer.trainer import Trainer
from agentrl.types import Group, Task
from tests.view.runs import _episode

pytestmark = pytest.mark.timeout(300)


def test_one_step_records_every_trained_token(tiny_model: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    task = Task("t0", "agentrl/Calculator-v0", 0)
    good = _episode(tokenizer, "t0/0", task, ["I will add.", "It is 2."], [0, 0])
    bad = dataclasses.replace(
        _episode(tokenizer, "t0/1", task, ["No idea.", "7"], [0, 0]), reward=0.0
    )
    failed = dataclasses.replace(
        _episode(tokenizer, "t0/2", task, ["x"], [0]), status="failed", reward=0.0
    )
    groups = [Group(task, 3, [good, bad, failed])]
    recorder = TokenRecorder(tmp_path)
    trainer = Trainer(
        str(tiny_model), TrainerConfig(lr=1e-3), temperature=1.0, seed=0, recorder=recorder
    )
    scored = {
        key: lp[r].numpy() for lp, mb in trainer.score(groups) for r, key in enumerate(mb.keys)
    }
    advantages = {r.trajectory.episode_id: r.advantage for r in rows_from_groups(groups)}
    trainer.train_step(groups)
    for t in (good, bad):
        record = read_record(tmp_path, t.episode_id, t.attempt)[0]
        sampled = t.loss_mask.astype(bool)
        assert all(len(v) == len(t) for v in record.values())
        assert record["trainer_logprob"][0] is None and record["masked"][0] is False
        lp = np.array([math.nan if x is None else x for x in record["trainer_logprob"]])
        expected = scored[(t.episode_id, 0, 0)][: len(t) - 1]
        assert np.allclose(lp[1:], expected, atol=2e-2), "not the logprobs the trainer computed"
        adv = np.array(record["advantage"][1:], dtype=float)
        assert np.allclose(adv[sampled[1:]], advantages[t.episode_id], atol=1e-3)
        weights = np.array([record["importance_weight"][j] for j in np.flatnonzero(sampled)])
        assert (weights > 0).all()
        assert not any(m for m, s in zip(record["masked"], sampled, strict=True) if not s)
    assert advantages["t0/0"] > 0 > advantages["t0/1"]
    assert read_record(tmp_path, "t0/2", 0) == {}  # a failed episode is not trained
    recorder.close()
    size = (tmp_path / RECORD_FILE).stat().st_size
    assert size < 64 * 1024, f"the record of two short trajectories takes {size} bytes"


def test_without_a_recorder_nothing_is_written(tiny_model: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    task = Task("t0", "agentrl/Calculator-v0", 0)
    episodes = [_episode(tokenizer, f"t0/{i}", task, ["a", "b"], [0, 0]) for i in range(2)]
    trainer = Trainer(str(tiny_model), TrainerConfig(), temperature=1.0, seed=0)
    trainer.train_step(
        [Group(task, 2, [episodes[0], dataclasses.replace(episodes[1], reward=0.0)])]
    )
    assert not (tmp_path / RECORD_FILE).exists() and read_record(tmp_path, "t0/0", 0) == {}

"""``agentrl export`` on a recorded run: each format read back by its own tools.

* inspect: the ``.eval`` log, opened with Inspect's own reader, gives back every
  episode's messages (tool calls paired with their results), reward score and metadata;
  past ``SAMPLES_PER_LOG`` samples the export rolls to a new log, and the folder's logs
  hold every episode once;
* atif: each line passes the ``atif`` models' validation, and its token ids, logprobs
  and per-token versions equal the store's;
* jsonl and atif read back (:func:`agentrl.export.read_trajectories`) give the recorded
  arrays exactly, and the filters of ``agentrl replay`` apply;
* a missing output folder is created; an output path that cannot be written is refused
  in one line.
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentrl import replay
from agentrl.errors import ConfigError
from agentrl.export import export_run, read_trajectories
from agentrl.store import EpisodeStore

pytestmark = pytest.mark.timeout(240)


def _export(run_dir: Path, fmt: str, out: Path, **filters: Any) -> Path:
    with EpisodeStore.open(run_dir, create=False) as store:
        return asyncio.run(export_run(store, fmt, out, **filters)).path  # type: ignore[arg-type]


def _recorded(run_dir: Path) -> dict[str, replay.Recorded]:
    with EpisodeStore.open(run_dir, create=False) as store:
        return {f"{r.episode_id}#{r.attempt}": r for r in replay.select(store)}


def test_inspect_log_read_by_inspect_holds_every_episode(run_dir: Path, tmp_path: Path) -> None:
    from inspect_ai.log import read_eval_log

    path = _export(run_dir, "inspect", tmp_path / "missing" / "logs")
    assert path == tmp_path / "missing" / "logs"
    assert [p.name for p in path.iterdir()] == ["calc-demo-0001.eval"]
    log = read_eval_log(str(path / "calc-demo-0001.eval"))
    recorded = _recorded(run_dir)
    assert log.status == "success" and log.samples is not None
    assert sorted(str(s.id) for s in log.samples) == sorted(recorded) and len(recorded) == 9
    assert log.eval.metadata["agentrl_run_config"]["run"]["name"] == "calc-demo"
    for sample in log.samples:
        r = recorded[str(sample.id)]
        roles = [m.role for m in sample.messages]
        assert roles == [m["role"] for m in r.messages], sample.id
        texts = [m.text for m in sample.messages]
        assert texts == [str(m.get("content") or "") for m in r.messages], sample.id
        meta = sample.metadata
        assert (meta["env_id"], meta["seed"], meta["attempt"], meta["state"]) == (
            r.task.env_id,
            r.task.seed,
            r.attempt,
            r.state,
        )
        if r.partial is not None:  # unfinished: no score yet
            assert not sample.scores and meta["related"]["kind"] == "resumed"
            continue
        t = r.trajectories[0]
        assert sample.scores["reward"].value == t.reward
        assert sample.scores["reward"].metadata["failure"] == (t.failure and t.failure.value)
        assert meta["policy_versions"] == [0, 1] and meta["status"] == t.status
        call, result = sample.messages[2], sample.messages[3]
        assert call.tool_calls[0].function == "calculator"
        assert call.tool_calls[0].arguments["expression"].replace(" ", "")
        assert result.role == "tool" and result.tool_call_id == call.tool_calls[0].id
    failed = next(s for s in log.samples if s.metadata["state"] == "retried")
    assert failed.metadata["failure"] == "env_timeout"
    rewards = [r.trajectories[0].reward for r in recorded.values() if r.trajectories]
    mean = log.results.scores[0].metrics["mean"].value
    assert len(rewards) == 8 and mean == pytest.approx(sum(rewards) / 8)


def test_inspect_rolls_to_a_new_log_every_samples_per_log(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from inspect_ai.log import list_eval_logs, read_eval_log

    from agentrl.export import inspect_format

    monkeypatch.setattr(inspect_format, "SAMPLES_PER_LOG", 4)
    path = _export(run_dir, "inspect", tmp_path / "logs")
    names = sorted(p.name for p in path.iterdir())
    assert names == ["calc-demo-0001.eval", "calc-demo-0002.eval", "calc-demo-0003.eval"]
    assert len(list_eval_logs(str(path))) == 3  # what `inspect view --log-dir` lists
    logs = [read_eval_log(str(path / name)) for name in names]
    assert [len(log.samples or []) for log in logs] == [4, 4, 1]
    ids = [str(s.id) for log in logs for s in log.samples or []]
    assert sorted(ids) == sorted(_recorded(run_dir))
    assert len({log.eval.eval_id for log in logs}) == 3
    assert [log.eval.task_id for log in logs] == [n.removesuffix(".eval") for n in names]
    assert {log.eval.run_id for log in logs} == {"calc-demo"}
    for log in logs:  # each log's mean is over its own scored samples
        rewards = [s.scores["reward"].value for s in log.samples or [] if s.scores]
        if not rewards:  # the last log holds only the unfinished episode: no score
            assert log.results.scores == []
            continue
        mean = log.results.scores[0].metrics["mean"].value
        assert mean == pytest.approx(sum(rewards) / len(rewards))
    assert sum(len([s for s in log.samples or [] if s.scores]) for log in logs) == 8
    with pytest.raises(ConfigError, match=r"already holds calc-demo-0001\.eval"):
        _export(run_dir, "inspect", path)
    with pytest.raises(ConfigError, match=r"give a folder, e\.g\."):
        _export(run_dir, "inspect", tmp_path / "x.eval")


def test_atif_validates_and_carries_the_stores_tokens(run_dir: Path, tmp_path: Path) -> None:
    import atif

    path = _export(run_dir, "atif", tmp_path / "a" / "episodes.atif.jsonl")
    recorded = _recorded(run_dir)
    documents = [atif.Trajectory.model_validate_json(line) for line in path.open()]
    assert sorted(d.trajectory_id for d in documents) == sorted(recorded)
    for doc in documents:
        r = recorded[doc.trajectory_id]
        seg = r.segments()[0]
        agent = [s for s in doc.steps if s.source == "agent" and s.metrics is not None]
        assert len(agent) == len(r.turn_starts) or r.partial is not None
        for step in agent:
            m = step.metrics
            start = len(m.prompt_token_ids)
            end = start + len(m.completion_token_ids)
            assert m.prompt_token_ids == seg.token_ids[:start].tolist()
            assert m.completion_token_ids == seg.token_ids[start:end].tolist()
            assert m.logprobs == pytest.approx(seg.logprobs[start:end].tolist())
            assert m.extra["versions"] == seg.versions[start:end].tolist()
            assert all(not math.isnan(x) for x in m.logprobs)
        calls = [c for s in agent for c in s.tool_calls or []]
        results = [x for s in agent for x in (s.observation.results if s.observation else [])]
        assert {x.source_call_id for x in results if x.source_call_id} <= {
            c.tool_call_id for c in calls
        }
    fork = next(d for d in documents if "~fork@1" in d.trajectory_id)
    assert fork.extra["agentrl"]["related"] == {"kind": "fork", "of": fork.session_id, "at_turn": 1}
    assert [s.is_copied_context for s in fork.steps] == [True, True, True, None]
    retry = next(d for d in documents if d.trajectory_id.endswith("#1"))
    assert retry.extra["agentrl"]["related"]["kind"] == "attempt"


@pytest.mark.parametrize("fmt", ["jsonl", "atif"])
def test_read_back_gives_the_recorded_arrays(run_dir: Path, tmp_path: Path, fmt: str) -> None:
    path = _export(run_dir, fmt, tmp_path / f"episodes.{fmt}", state=["finished"])
    back = list(read_trajectories(path))
    with EpisodeStore.open(run_dir, create=False) as store:
        stored = [t for r in replay.select(store, state=["finished"]) for t in r.trajectories]
    assert len(back) == len(stored) == 7
    for got, want in zip(back, stored, strict=True):
        assert got.episode_id == want.episode_id and got.reward == want.reward
        for name in ("token_ids", "versions", "loss_mask"):
            assert getattr(got, name).tolist() == getattr(want, name).tolist(), name
        assert got.logprobs.tolist() == pytest.approx(want.logprobs.tolist(), nan_ok=True)
        assert got.spans == want.spans


def test_filters_and_output_paths(run_dir: Path, tmp_path: Path) -> None:
    path = _export(run_dir, "jsonl", tmp_path / "f.jsonl", state=["paused"])
    assert [line.count('"kind": "partial"') for line in path.open()] == [1]
    path = _export(run_dir, "jsonl", tmp_path / "l.jsonl", limit=2, env_id="nope/Env-v0")
    assert path.read_text() == ""
    made = tmp_path / "not" / "there" / "yet.jsonl"  # replay --export: a folder is made too
    done = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "replay", str(run_dir), "--export", str(made)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and len(made.read_text().splitlines()) == 9, done.stderr
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for fmt, name in (("jsonl", "x.jsonl"), ("inspect", "logs")):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "agentrl.cli",
                "export",
                str(run_dir),
                "--format",
                fmt,
                "--out",
                str(blocker / "under" / name),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 1, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "choose another" in lines[0], done.stderr

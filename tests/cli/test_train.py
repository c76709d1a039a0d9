"""`agentrl train` end to end (real vLLM, tiny model), watched by `agentrl top`.

One run of the digits env: while it trains, `agentrl top --once` shows its in-flight
episodes; afterwards the run directory holds everything the README promises, and
`--resume` with more steps trains on from the last checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from agentrl.config import RunConfig
from agentrl.monitor import read_metrics, read_status, top
from agentrl.store import EpisodeStore

AGENTRL = str(Path(sys.executable).parent / "agentrl")

CONFIG = """
[run]
name = "digits-test"
[env]
id = "agentrl/Digits-v0"
[rollout]
group_size = 8
concurrency = 32
max_turns = 1
max_tokens_per_turn = 16
# Room to generate ahead: with 1, a step waits for the groups admitted a version
# before and often trains with nothing in flight (these episodes take about a second).
max_staleness = 2
[trainer]
lr = 3e-3
[train]
steps = 4
groups_per_step = 4
checkpoint_every = 2
[eval]
episodes = 16
[log]
progress = "plain"
status_every_s = 0.1
"""


def _top(run_dir: Path) -> str:
    proc = subprocess.run(
        [AGENTRL, "top", str(run_dir), "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.vllm
def test_train_cli_run_dir_top_and_resume(
    tmp_path: Path,
    model_cache: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich: room for every column of the table
    run_dir = tmp_path / "run"
    config = tmp_path / "digits.toml"
    config.write_text(CONFIG)
    env = {**os.environ, "AGENTRL_CACHE": str(model_cache)}
    log = (tmp_path / "train.log").open("wb")
    command = [AGENTRL, "train", str(config), f'--run.out="{run_dir}"']
    proc = subprocess.Popen(
        command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    live_view = None
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            status = read_status(run_dir)
            if status and status["state"] == "training" and status["in_flight"] > 0:
                # `agentrl top --once` in this process: a subprocess needs a second to start,
                # by when these short episodes may have ended
                capsys.readouterr()
                assert top(run_dir, once=True) == 0
                view = capsys.readouterr().out
                if "in-flight episodes (0)" not in view:
                    live_view = view
                    break
            time.sleep(0.05)
        assert proc.wait(timeout=600) == 0, (tmp_path / "train.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    output = (tmp_path / "train.log").read_text()

    # `agentrl top` against the live run listed its in-flight episodes
    assert live_view is not None, "never saw the run training with episodes in flight"
    view = live_view
    assert "training" in view and "in-flight episodes (" in view
    rows = [line for line in view.splitlines() if "agentrl/Digits-v0" in line]
    assert rows, view  # one row per in-flight episode: env, turn, versions, waiting on
    assert any(phase in rows[0] for phase in ("engine", "env", "tool", "paused")), rows[0]

    # plain progress: one line per step, evaluation before and after
    assert [line.split()[1] for line in output.splitlines() if line.startswith("step ")] == [
        "1/4",
        "2/4",
        "3/4",
        "4/4",
    ]
    assert "eval before (version 0, 16 held-out episodes)" in output
    assert "eval after (version 4, 16 held-out episodes)" in output

    # the run directory
    recorded = RunConfig.from_dict(tomllib.loads((run_dir / "config.toml").read_text()))
    assert recorded.train.steps == 4 and recorded.run.out == str(run_dir)
    rows = read_metrics(run_dir, "train")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for key in (
        "reward_mean",
        "success_rate",
        "tokens_per_s",
        "staleness_mean",
        "queue_depth",
        "in_flight",
        "loss",
        "publish_s",
        "generation_busy_s",
    ):
        assert key in rows[-1], key
    evals = read_metrics(run_dir, "eval")
    assert [(e["label"], e["episodes"]) for e in evals] == [("before", 16), ("after", 16)]
    final = read_status(run_dir)
    assert final is not None and final["state"] == "finished" and final["step"] == 4

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/reward_mean")] == [1, 2, 3, 4]
    assert acc.Scalars("eval/success_rate")[0].step == 0

    trace = json.loads((run_dir / "trace.json").read_text())  # closed: strict JSON
    spans = [e for e in trace if e.get("ph") == "X"]
    train_spans = [e for e in spans if e["cat"] == "train"]
    sync_spans = [e for e in spans if e["cat"] == "sync"]
    engine_spans = [e for e in spans if e["cat"] == "episode" and e["name"] == "engine"]
    assert len(train_spans) == 4 and len(sync_spans) == 4 and engine_spans
    # async: some generation ran while the trainer stepped
    overlap = any(
        g["ts"] < t["ts"] + t["dur"] and t["ts"] < g["ts"] + g["dur"]
        for t in train_spans
        for g in engine_spans
        if g["pid"] == 1
    )
    assert overlap, "no generation span overlaps a training step"
    for name in ("reward", "staleness", "throughput"):
        assert (run_dir / "plots" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (run_dir / "model" / "config.json").is_file()
    assert (run_dir / "checkpoints").is_dir()

    # `agentrl top` against the finished run
    view = _top(run_dir)
    assert "finished" in view and "store: episodes" in view and "eval after" in view

    # --resume with more steps trains on from step 4 (no evaluation before: step > 0)
    proc = subprocess.run(
        [AGENTRL, "train", "--resume", str(run_dir), "--train.steps=6", "--eval.episodes=0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "resumed at step 4" in proc.stdout
    assert [r["step"] for r in read_metrics(run_dir, "train")] == [1, 2, 3, 4, 5, 6]
    with EpisodeStore.open(run_dir, create=False) as store:
        assert store.last_step() == 6
        assert store.integrity_check() == "ok"
        assert len([r for r in store.runs() if r["kind"] == "train"]) == 2


WORKERS_CONFIG = """
[run]
name = "calculator-workers"
[env]
id = "agentrl/Calculator-v0"
[rollout]
group_size = 4
concurrency = 32
max_turns = 3
max_tokens_per_turn = 24
max_staleness = 2
workers = 2
[train]
steps = 3
groups_per_step = 4
[eval]
episodes = 0
[log]
progress = "plain"
"""


@pytest.mark.vllm
def test_train_with_rollout_worker_processes(tmp_path: Path, model_cache: Path) -> None:
    """`rollout.workers = 2`: the episodes run in two worker processes, the engine, trainer
    and store in the main one; every step trains, each task once, and the trace still
    shows each episode's generations."""
    run_dir = tmp_path / "run"
    config = tmp_path / "workers.toml"
    config.write_text(WORKERS_CONFIG)
    env = {**os.environ, "AGENTRL_CACHE": str(model_cache)}
    proc = subprocess.run(
        [AGENTRL, "train", str(config), f'--run.out="{run_dir}"'],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("step ")] == [
        "1/3",
        "2/3",
        "3/3",
    ]
    rows = read_metrics(run_dir, "train")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["tokens_per_s"] > 0 and "in_flight" in rows[-1]
    with EpisodeStore.open(run_dir, create=False) as store:
        audit = store.audit()
        assert audit["ok"], audit
        assert audit["trained_tasks"] == 3 * 4
        assert [v["version"] for v in store.versions()] == [1, 2, 3]
    trace = json.loads((run_dir / "trace.json").read_text())
    engine = [
        e for e in trace if e.get("ph") == "X" and e["cat"] == "episode" and e["name"] == "engine"
    ]
    assert engine, "no episode generation spans in the trace"

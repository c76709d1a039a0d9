"""Finding run directories and telling their status apart (agentrl.view.runs), on real
files: running (a live pid in status.json), ended, crashed-resumable (the process gone
with work unfinished, or a rollout run left with unfinished episodes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.errors import ConfigError
from agentrl.store import EpisodeStore
from agentrl.view import runs

pytestmark = pytest.mark.timeout(60)


def status(run: Path, state: str, pid: int) -> None:
    (run / "status.json").write_text(json.dumps({"state": state, "pid": pid}))


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_each_status(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with EpisodeStore.open(run) as store:
        store.begin_run("train", {})
    status(run, "training", os.getpid())
    assert runs.run_status(run, unfinished=0) == "running"
    status(run, "training", dead_pid())
    assert runs.run_status(run, unfinished=0) == "crashed-resumable"
    status(run, "interrupted", os.getpid())
    assert runs.run_status(run, unfinished=3) == "crashed-resumable"
    status(run, "finished", 0)
    assert runs.run_status(run, unfinished=0) == "ended"
    (run / "status.json").unlink()  # a rollout run: no status.json
    assert runs.run_status(run, unfinished=2) == "crashed-resumable"
    assert runs.run_status(run, unfinished=0) == "ended"


def test_runs_are_found_under_a_root_and_only_there(tmp_path: Path) -> None:
    for name in ("a", "group/b", "group/deeper/c"):
        with EpisodeStore.open(tmp_path / name) as store:
            store.begin_run("rollout", {})
    (tmp_path / "not-a-run").mkdir()
    (tmp_path / ".hidden").mkdir()
    with EpisodeStore.open(tmp_path / ".hidden" / "x") as store:
        store.begin_run("rollout", {})
    found = runs.find_runs(tmp_path)
    assert sorted(found) == ["a", "group/b", "group/deeper/c"]
    assert runs.find_runs(tmp_path / "a") == {".": (tmp_path / "a").resolve()}
    with pytest.raises(ConfigError, match="is not a directory"):
        runs.find_runs(tmp_path / "missing")
    row = runs.summary("a", found["a"])
    assert (row["kind"], row["status"], row["episodes"], row["steps"]) == ("rollout", "ended", 0, 0)

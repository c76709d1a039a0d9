"""A run directory on a full or read-only disk.

* The store itself (fast): SQLite's "database or disk is full" mid-transaction is a
  StoreError naming the file and what to do; the transaction is rolled back, earlier
  data and ``integrity_check`` are intact, and writing works again once there is room.
* Read-only (fast, needs a private mount namespace: root on Linux): `--resume` on a
  read-only bind mount of a run directory is one clear error and changes nothing.
* Full (soak): `agentrl train` with its run directory on a small tmpfs runs until the
  disk fills, stops with an error naming the path; the store passes
  ``integrity_check`` and the audit, and `--resume` on a disk with room finishes.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agentrl.errors import StoreError
from agentrl.store import EpisodeStore
from agentrl.types import Task
from tests.faults.harness import (
    AGENTRL,
    Proc,
    agentrl_env,
    audit,
    digits_config,
)
from tests.faults.test_bad_input import _one_error, _run_dir, _snapshot


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
        capture_output=True,
        timeout=30,
    )
    return probe.returncode == 0


needs_mounts = pytest.mark.skipif(
    not _namespaces_work(), reason="needs `unshare -m` and mount (root on Linux)"
)


def test_a_full_store_is_a_clear_error_and_loses_nothing(tmp_path: Path, record_fault: Any) -> None:
    store = EpisodeStore.open(tmp_path)
    store.add_tasks([Task(f"t{i}", "agentrl/Digits-v0", i) for i in range(10)], 8)
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages + 1}")  # the disk is now "full"
    big = [
        Task(f"big{i}", "agentrl/Digits-v0", i, env_kwargs={"pad": "x" * 4000}) for i in range(50)
    ]
    with pytest.raises(StoreError) as err:
        store.add_tasks(big, 8)
    message = str(err.value)
    kept = len(store.tasks())
    integrity = store.integrity_check()
    record_fault(
        "store: database or disk full mid-transaction",
        injected=1,
        survived=int(integrity == "ok" and kept == 10),
        lost=10 - kept,
    )
    assert "full" in message and str(tmp_path / "episodes.db") in message
    assert "disk has space" in message and "--resume" in message
    assert kept == 10, "the failed transaction was rolled back, the earlier one kept"
    assert integrity == "ok"
    store._db.execute("PRAGMA max_page_count = 1073741823")  # room again
    store.add_tasks(big, 8)
    assert len(store.tasks()) == 60
    store.close()


@needs_mounts
def test_resume_on_a_read_only_run_directory_is_one_clear_error(
    tmp_path: Path, model_cache: Path, record_fault: Any
) -> None:
    run = _run_dir(tmp_path)
    before = _snapshot(run)
    script = (
        f"mount --bind -o ro {shlex.quote(str(run))} {shlex.quote(str(run))} && "
        f"exec {AGENTRL} train --resume {shlex.quote(str(run))}"
    )
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c", script],
        env=agentrl_env(model_cache),
        capture_output=True,
        text=True,
        timeout=300,
    )
    error = _one_error(proc.stdout + proc.stderr)
    after = _snapshot(run)
    record_fault(
        "run directory read-only at --resume",
        injected=1,
        survived=int(proc.returncode == 1),
        lost=int(after != before),
    )
    assert proc.returncode == 1
    assert "is not writable (a read-only file system" in error and str(run) in error, error
    assert after == before


@needs_mounts
@pytest.mark.soak
@pytest.mark.vllm
@pytest.mark.timeout(1200)
def test_disk_full_mid_run_stops_clearly_and_resume_finishes_once_there_is_room(
    tmp_path: Path, model_cache: Path, tiny_model: Path, record_fault: Any
) -> None:
    steps = 6
    run, saved = tmp_path / "run", tmp_path / "saved"
    run.mkdir()
    weights = sum(f.stat().st_size for f in tiny_model.glob("*.safetensors"))
    size_kib = (3 * weights + 3 * 2**20) // 1024  # room for one checkpoint, not two
    config = digits_config(tmp_path, steps)
    q = shlex.quote
    script = (
        f"mount -t tmpfs -o size={size_kib}k tmpfs {q(str(run))} && "
        f"{AGENTRL} train {q(str(config))} --run.out={q(repr(str(run)))}; rc=$?; "
        f"df -k {q(str(run))}; cp -a {q(str(run))}/. {q(str(saved))}/; exit $rc"
    )
    saved.mkdir()
    proc = Proc(
        ["unshare", "-m", "sh", "-c", script], tmp_path / "full.log", agentrl_env(model_cache)
    )
    rc = proc.wait(600)
    errors = [ln for ln in proc.text().splitlines() if ln.startswith("agentrl: error:")]
    shutil.rmtree(run)
    saved.rename(run)  # "space is back": the same run directory on the big disk
    stopped = audit(run)
    leftovers = [p.name for p in (run / "checkpoints").glob(".*tmp*")]
    resumed = Proc(
        [AGENTRL, "train", "--resume", str(run)], tmp_path / "resume.log", agentrl_env(model_cache)
    )
    rc_resume = resumed.wait(600)
    end = audit(run)
    record_fault(
        "run directory disk full mid-run (then --resume)",
        injected=1,
        survived=int(rc_resume == 0 and end["ok"]),
        lost=len(stopped["lost"]) + len(end["lost"]),
        trained_twice=len(end["trained_twice"]),
    )

    assert rc == 1, proc.tail()
    assert len(errors) == 1 and "No space left on device" in errors[0], proc.tail()
    assert str(run) in errors[0] and f"agentrl train --resume {run}" in errors[0]
    assert stopped["integrity"] == "ok" and stopped["ok"], stopped
    assert not leftovers, f"half-written checkpoints left behind: {leftovers}"
    assert rc_resume == 0, resumed.tail()
    assert end["ok"] and end["consumed_steps"] == steps

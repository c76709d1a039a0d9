"""agentrl.runtime.cores against real processes: a child that names itself as vLLM's worker and
binds itself to core 0, as vLLM's CPU worker does (the real engine: tests/inference/
test_engine.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from agentrl.runtime import cores

pytestmark = pytest.mark.skipif(
    not cores.supported() or len(os.sched_getaffinity(0)) < 2, reason="Linux, 2+ cores"
)

WORKER = """
import os, sys, time
with open("/proc/self/comm", "w") as f:
    f.write(sys.argv[1])
os.sched_setaffinity(0, {int(c) for c in sys.argv[2].split(",")})
print("ready", flush=True)
time.sleep(60)
"""


def _child(name: str, bound: set[int]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, name, ",".join(map(str, sorted(bound)))],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


@pytest.fixture
def all_cores() -> Iterator[set[int]]:
    """The test's cores; every thread of this process has them back afterwards."""
    mine = set(os.sched_getaffinity(0))
    yield mine
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), mine)
        except OSError:
            pass


def thread_core_sets() -> set[frozenset[int]]:
    """The distinct sets of cores this process's threads may run on."""
    out = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            out.add(frozenset(os.sched_getaffinity(int(tid))))
        except OSError:  # ended meanwhile
            pass
    return out


def _in_thread(fn):  # type: ignore[no-untyped-def]
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(fn()))
    thread.start()
    thread.join()
    return result[0]


def test_keeps_every_thread_off_the_workers_cores_and_gives_them_back(
    all_cores: set[int],
) -> None:
    worker = _child("VLLM::Worker", {0})
    other = _child("python", {max(all_cores)})  # bound, but not vLLM's worker: ignored
    stop = threading.Event()
    before = threading.Thread(target=stop.wait)  # a thread that exists already
    before.start()
    try:
        assert cores.worker_cores() == {0}
        claim = cores.keep_off(cores.worker_cores())
        assert claim is not None
        rest = all_cores - {0}
        assert thread_core_sets() == {frozenset(rest)}, "every thread, the older one too"
        assert _in_thread(lambda: os.sched_getaffinity(0)) == rest, "a new thread inherits it"
        assert cores.process_cores() == all_cores, "what the process had before"
        # a process started inside every_core() may choose among all of them
        with cores.every_core():
            assert os.sched_getaffinity(0) == all_cores
            child = subprocess.run(
                [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                capture_output=True,
                text=True,
                check=True,
            )
        assert child.stdout.strip() == str(sorted(all_cores))
        assert os.sched_getaffinity(0) == rest, "and the calling thread is narrowed again"
        with cores.suspended():  # the benchmark's diagnostic: every thread on every core
            assert thread_core_sets() == {frozenset(all_cores)}
        assert thread_core_sets() == {frozenset(rest)}
        cores.release(claim)
        assert thread_core_sets() == {frozenset(all_cores)}
    finally:
        stop.set()
        before.join()
        for proc in (worker, other):
            proc.kill()
            proc.wait()


def test_a_thread_that_chose_its_own_cores_keeps_them(all_cores: set[int]) -> None:
    worker = _child("VLLM::Worker_TP0", {0})
    go, stop = threading.Event(), threading.Event()
    seen: list[set[int]] = []

    def pinned() -> None:  # a thread that pinned itself (neither all cores nor the rest)
        os.sched_setaffinity(0, {0})
        go.set()
        stop.wait()
        seen.append(set(os.sched_getaffinity(0)))

    thread = threading.Thread(target=pinned)
    thread.start()
    go.wait()
    try:
        claim = cores.keep_off(cores.worker_cores())
        assert claim is not None
        cores.release(claim)
    finally:
        stop.set()
        thread.join()
        worker.kill()
        worker.wait()
    assert seen == [{0}]


def test_nothing_moves_when_no_core_would_be_left_or_none_is_bound(all_cores: set[int]) -> None:
    everywhere = _child("VLLM::Worker", all_cores)
    try:
        assert cores.worker_cores() == set(), "bound to every core: not a claim"
        assert cores.keep_off(all_cores) is None
        assert cores.keep_off(set()) is None
        assert thread_core_sets() == {frozenset(all_cores)}
    finally:
        everywhere.kill()
        everywhere.wait()

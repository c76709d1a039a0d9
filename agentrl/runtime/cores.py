"""Keep this process's threads off the cores vLLM's CPU workers bind themselves to.

vLLM's CPU backend binds each worker's compute threads to cores of their own
(``VLLM_CPU_OMP_THREADS_BIND=auto``, its default: every allowed core but the ones it
reserves for its engine core and front end; core 0 of a 2-core machine), and its worker
and engine core spin while they wait for each other. The kernel still places this
process's threads (the engine's client, the event loop, the env, render and store
threads) on any core, so a client thread that wakes on the worker's core preempts the
forward pass itself: the engine then loses the client's CPU time and the wait around
it. Measured with ``/proc/<tid>/schedstat`` (2 cores, tiny model, 64 episodes x 3 turns,
21 rounds each; the worker's time runnable but not running, a round): 25 ms under raw
``AsyncLLM`` and 65 ms under the platform with the store, 6-11 ms for both with the
client kept off core 0, which took the platform from 0.912 to 0.948-0.955 of raw vLLM
(the overhead benchmark, ``benchmarks/bench_overhead.py``).

So once an engine is up, :func:`keep_off` narrows every thread of this process to the
other cores; threads started later inherit it from the thread that starts them. It does
nothing where no worker is bound (vLLM on a GPU, ``VLLM_CPU_OMP_THREADS_BIND=nobind``)
or where no core would be left. Processes that must choose their own cores (a vLLM engine
started later, which binds its worker among the cores it is allowed) are started inside
:func:`every_core`. Linux only (``os.sched_setaffinity``); elsewhere nothing happens.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterable, Iterator

logger = logging.getLogger(__name__)

WORKER_PREFIX = "VLLM::Worker"
"""The process title vLLM gives its worker processes (``VLLM::Worker``,
``VLLM::Worker_TP1``, ...), as the kernel reports it (``/proc/<pid>/comm``)."""

_lock = threading.Lock()
_process_cores: frozenset[int] | None = None
"""The cores this process had before the first :func:`keep_off` narrowed it."""
_claims: dict[int, frozenset[int]] = {}
"""Live claims: claim id -> the workers' cores this process keeps off."""
_applied: frozenset[int] | None = None
"""The cores this module last gave the process's threads (None: it has not narrowed them)."""
_next_claim = 0


def supported() -> bool:
    return hasattr(os, "sched_setaffinity") and os.path.isdir("/proc/self/task")


def process_cores() -> set[int]:
    """The cores this process may use, as they were before :func:`keep_off` narrowed
    its threads (what a trainer may borrow while generation waits)."""
    if _process_cores is not None:
        return set(_process_cores)
    return set(os.sched_getaffinity(0)) if supported() else set(range(os.cpu_count() or 1))


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from ``/proc/<pid>/task/<tid>/children``)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tids = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    kids = [int(x) for x in f.read().split()]
            except OSError:
                continue
            out.extend(kids)
            todo.extend(kids)
    return out


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _thread_cores(pid: int) -> set[int]:
    """The union of the cores the threads of ``pid`` may run on (empty if it is gone)."""
    cores: set[int] = set()
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                cores |= os.sched_getaffinity(int(tid))
    return cores


def worker_cores(root: int | None = None) -> set[int]:
    """The cores vLLM's worker processes under ``root`` (default: this process) are
    bound to, where that is fewer than this process's own (empty where none is bound)."""
    if not supported():
        return set()
    allowed = process_cores()
    bound: set[int] = set()
    for pid in _children(os.getpid() if root is None else root):
        if _comm(pid).startswith(WORKER_PREFIX):
            cores = _thread_cores(pid)
            if cores and cores < allowed:
                bound |= cores
    return bound


def _tids() -> list[int]:
    return [int(t) for t in os.listdir("/proc/self/task")]


def _set_threads(target: frozenset[int], previous: frozenset[int] | None) -> None:
    """Give every thread of this process ``target``: those on every core of the process
    or on ``previous`` (what this module gave them before); a thread that chose other
    cores itself (the trainer's pin) keeps them."""
    whole = frozenset(_process_cores or ())
    for tid in _tids():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            mine = frozenset(os.sched_getaffinity(tid))
            if mine in (whole, previous) and mine != target:
                os.sched_setaffinity(tid, target)


def _apply() -> frozenset[int]:
    global _applied
    assert _process_cores is not None
    claimed = frozenset().union(*_claims.values()) if _claims else frozenset()
    target = _process_cores - claimed or _process_cores
    _set_threads(target, _applied)
    _applied = target if target != _process_cores else None
    return target


def keep_off(cores: Iterable[int]) -> int | None:
    """Narrow this process's threads to its cores but ``cores`` (those vLLM's workers
    are bound to); returns a claim for :func:`release`, or None where nothing was
    narrowed (nothing to keep off, no core left, or not Linux)."""
    global _process_cores, _next_claim
    cores = frozenset(cores)
    if not cores or not supported():
        return None
    with _lock:
        if _process_cores is None:
            _process_cores = frozenset(os.sched_getaffinity(0))
        if not _process_cores - cores:
            logger.info(
                "vLLM's workers are bound to every core of this process (%s): not moving it",
                sorted(_process_cores),
            )
            return None
        _next_claim += 1
        _claims[_next_claim] = cores
        target = _apply()
    logger.info(
        "this process runs on core(s) %s, off core(s) %s that vLLM's CPU worker is bound "
        "to (inference.keep_off_worker_cores)",
        sorted(target),
        sorted(cores),
    )
    return _next_claim


def release(claim: int | None) -> None:
    """Drop a claim from :func:`keep_off`: this process's threads get back the cores no
    live claim keeps them off (all of them when none is left)."""
    if claim is None:
        return
    with _lock:
        if _claims.pop(claim, None) is not None and _process_cores is not None:
            _apply()


@contextlib.contextmanager
def every_core() -> Iterator[None]:
    """Run the block on every core of the process (the calling thread only), e.g. to
    start an engine whose worker must choose its cores among all of them; processes
    started inside inherit that."""
    if not supported() or _applied is None or _process_cores is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, _process_cores)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, before)


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Every thread of this process on every core for the block, kept off the workers'
    cores again after it (``benchmarks/bench_overhead.py --every-core``: what keeping
    off them buys)."""
    with _lock:
        saved = dict(_claims)
        _claims.clear()
        if _process_cores is not None:
            _apply()
    try:
        yield
    finally:
        with _lock:
            _claims.update(saved)
            if _process_cores is not None:
                _apply()

"""StoreWriter against a real SQLite store: a write leaves the queue only once committed.

* A failed commit (the disk is full) raises, keeps every write pending in order, and
  the next flush writes each exactly once.
* A failed background commit is not lost: the next call to the writer (a submit,
  ``flush``, leaving ``async with``) raises it, so the run stops with it.
* A checkpoint submitted while an older one of the same episode is being committed is
  kept (it does not overwrite the one in flight and vanish with it).
* A flush cancelled mid-commit neither loses its writes nor writes them twice.
* An episode that ends while its checkpoint waits: the checkpoint is not written.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from agentrl.errors import StoreError
from agentrl.runtime.metrics import Metrics
from agentrl.store import EpisodeStore, StoreWriter
from agentrl.types import PartialEpisode, Task

pytestmark = pytest.mark.timeout(30)

TASKS = [Task(f"t{i}", "agentrl/Digits-v0", i, env_kwargs={"pad": "x" * 4000}) for i in range(8)]


def checkpoint(task: Task, turn: int) -> PartialEpisode:
    """A checkpoint of episode ``<task>/0`` after ``turn`` turns (no tokens needed here)."""
    return PartialEpisode(
        episode_id=f"{task.task_id}/0",
        task=task,
        attempt=0,
        version=0,
        started_version=0,
        segments=[],
        messages=[],
        tools=None,
        turn=turn,
        turn_sampled=0,
        last_finish="stop",
        segments_started=1,
        rewards=[],
        tool_calls=0,
        env_state=None,
        env_log=[],
        turn_starts=[],
    )


def fill_disk(store: EpisodeStore) -> None:
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages + 1}")


def free_disk(store: EpisodeStore) -> None:
    store._db.execute("PRAGMA max_page_count = 1073741823")


def gate(store: EpisodeStore, monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, ...]:
    """Make ``store.save_partials`` wait (in the writer's thread) until released."""
    entered, release = threading.Event(), threading.Event()
    save = store.save_partials

    def gated(partials: Any) -> None:
        entered.set()
        assert release.wait(10), "the test never released the commit"
        save(partials)

    monkeypatch.setattr(store, "save_partials", gated)
    return entered, release


async def test_a_failed_commit_keeps_every_write_pending_and_the_next_writes_each_once(
    tmp_path: Path,
) -> None:
    metrics = Metrics()
    with EpisodeStore.open(tmp_path) as store:
        async with StoreWriter(store, interval_s=60, metrics=metrics) as writer:
            writer.task(TASKS[0], 2)
            await writer.flush()
            for task in TASKS[1:]:
                writer.task(task, 2)
            writer.started("t1/0", TASKS[1], 0, 0)
            writer.partial(checkpoint(TASKS[1], 1))
            writer.version(1, "full", "test", {"n": 1})
            pending = writer.pending
            fill_disk(store)
            with pytest.raises(StoreError, match="full"):
                await writer.flush()
            assert writer.pending == pending, "a failed commit drops nothing"
            assert [t.task_id for t in store.tasks()] == ["t0"], "and it was rolled back"
            free_disk(store)
            await writer.flush()
            assert writer.pending == 0
        assert [t.task_id for t in store.tasks()] == [t.task_id for t in TASKS], "in order"
        (episode,) = store.episodes()
        assert episode["episode_id"] == "t1/0" and episode["state"] == "paused"
        assert store.partial("t1/0").turn == 1
        assert [(v["version"], v["stats"]) for v in store.versions()] == [(1, {"n": 1})]
        assert metrics.counters["store_writes"] == 1 + pending, "each write committed once"
        assert store.integrity_check() == "ok"


async def test_a_failed_background_commit_is_raised_at_the_next_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_disk(*args: Any) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    with EpisodeStore.open(tmp_path) as store:
        monkeypatch.setattr(store, "episodes_started", broken_disk)
        writer = StoreWriter(store, interval_s=0.01)
        with pytest.raises(StoreError, match="disk I/O error") as at_exit:
            async with writer:
                writer.task(TASKS[0], 1)
                writer.started("t0/0", TASKS[0], 0, 0)
                assert writer._task is not None
                await asyncio.wait([writer._task], timeout=10)  # it stops at the failure
                with pytest.raises(StoreError, match="disk I/O error") as at_submit:
                    writer.partial(checkpoint(TASKS[0], 1))
                with pytest.raises(StoreError, match="disk I/O error"):
                    await writer.flush()
        assert at_exit.value is at_submit.value, "one failure, raised at every later call"
        assert writer.pending == 2, "the writes of the failed commit are still pending"
        assert store.tasks() == [] and store.episodes() == [], "nothing half-written"


async def test_a_checkpoint_submitted_during_a_commit_of_an_older_one_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with EpisodeStore.open(tmp_path) as store:
        store.add_tasks([TASKS[0]], 1)
        store.episode_started("t0/0", TASKS[0], 0, 0)
        entered, release = gate(store, monkeypatch)
        async with StoreWriter(store, interval_s=60) as writer:
            writer.partial(checkpoint(TASKS[0], 1))
            async with asyncio.TaskGroup() as tg:
                flushing = tg.create_task(writer.flush())
                try:
                    assert await asyncio.to_thread(entered.wait, 10)
                    writer.partial(checkpoint(TASKS[0], 2))
                    assert writer.pending == 2, "the newer one waits behind the one in flight"
                finally:
                    release.set()
            assert flushing.done() and writer.pending == 1
            assert store.partial("t0/0").turn == 1
        assert writer.pending == 0 and store.partial("t0/0").turn == 2


async def test_a_flush_cancelled_mid_commit_writes_each_write_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = Metrics()
    with EpisodeStore.open(tmp_path) as store:
        store.add_tasks([TASKS[0]], 1)
        store.episode_started("t0/0", TASKS[0], 0, 0)
        entered, release = gate(store, monkeypatch)
        async with StoreWriter(store, interval_s=60, metrics=metrics) as writer:
            writer.partial(checkpoint(TASKS[0], 1))
            writer.version(1, "full", "test", {})
            flushing = asyncio.create_task(writer.flush())
            try:
                assert await asyncio.to_thread(entered.wait, 10)
                flushing.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await flushing
                writer.version(2, "full", "test", {})
            finally:
                release.set()
        assert writer.pending == 0 and store.partial("t0/0").turn == 1
        assert [v["version"] for v in store.versions()] == [1, 2]
        assert metrics.counters["store_writes"] == 3, "each write committed once, none redone"


async def test_an_ended_episodes_pending_checkpoint_is_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end deletes the checkpoint anyway (same transaction); the other checkpoints of
    the batch are written together, in one save_partials call."""
    with EpisodeStore.open(tmp_path) as store:
        store.add_tasks(TASKS[:3], 1)
        for task in TASKS[:3]:
            store.episode_started(f"{task.task_id}/0", task, 0, 0)
        calls: list[list[str]] = []
        save = store.save_partials

        def spy(partials: Any) -> None:
            calls.append([p.episode_id for p in partials])
            save(partials)

        monkeypatch.setattr(store, "save_partials", spy)
        async with StoreWriter(store, interval_s=60) as writer:
            for task in TASKS[:3]:
                writer.partial(checkpoint(task, 1))
            writer.dropped("t0/0", 0, "test")  # t0 ends while its checkpoint waits
            await writer.flush()
        assert calls == [["t1/0", "t2/0"]]
        assert store.partial("t0/0") is None and store.partial("t2/0").turn == 1
        states = {e["episode_id"]: e["state"] for e in store.episodes()}
        assert states == {"t0/0": "dropped", "t1/0": "paused", "t2/0": "paused"}

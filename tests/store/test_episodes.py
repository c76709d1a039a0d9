"""The episode store, checkpoints and resume, against a scripted client (fast).

The same seams against real vLLM (pauses during live generation, crash-resume of a
real subprocess) are tested in tests/rollout/test_controller_vllm.py and
tests/rollout/test_crash_resume.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import re
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agentrl.env import TextEnv, register_env
from agentrl.errors import ConfigError, StoreError
from agentrl.queue import TrajectoryQueue
from agentrl.rollout import EpisodeRunner, RolloutConfig, Scheduler, tasks_for
from agentrl.store import SCHEMA_VERSION, EpisodeStore, StoreWriter
from agentrl.store.schema import encoded, segment_columns
from agentrl.types import FailureKind, Group, PartialEpisode, Task, Trajectory
from tests.rollout.fakes import ScriptedClient


class CounterEnv(TextEnv):
    """Deterministic from its seed, without get_state: resume must replay actions."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.total = int(self.np_random.integers(0, 10))
        self.steps = 0
        return f"Total {self.total}. Say a number.", {}

    def step(self, action: str):
        numbers = re.findall(r"\d+", action)
        self.total += int(numbers[-1]) if numbers else 0
        self.steps += 1
        return f"Total {self.total}.", 0.25, self.steps >= 4, False, {}


class NoisyEnv(CounterEnv):
    """Not deterministic from its seed: replaying its actions gives other observations."""

    calls = 0

    def step(self, action: str):
        NoisyEnv.calls += 1
        obs, *rest = super().step(action)
        return f"{obs} (call {NoisyEnv.calls})", *rest


register_env("tests/Counter-v0", CounterEnv)
register_env("tests/Noisy-v0", NoisyEnv)


def counting_model(prompt: Any) -> str:
    """A deterministic reply that depends on the whole prompt."""
    return f"Guess: {sum(prompt) % 97}"


def assert_same(a: Trajectory, b: Trajectory) -> None:
    assert a.token_ids.tolist() == b.token_ids.tolist()
    assert np.array_equal(a.logprobs, b.logprobs, equal_nan=True)
    assert a.versions.tolist() == b.versions.tolist()
    assert a.loss_mask.tolist() == b.loss_mask.tolist()
    assert a.spans == b.spans and a.messages == b.messages
    assert a.turn_rewards == b.turn_rewards and a.status == b.status and a.reason == b.reason


async def run_with_checkpoints(
    tokenizer: Any, env_id: str, seed: int = 3, interval_s: float = 0.0
) -> tuple[list[Trajectory], list[PartialEpisode]]:
    """One episode, with its checkpoints (every turn boundary's, by default)."""
    snapshots: list[PartialEpisode] = []
    client = ScriptedClient(tokenizer, counting_model)
    config = RolloutConfig(max_turns=8, checkpoint_interval_s=interval_s)
    runner = EpisodeRunner(client, tokenizer, config, checkpoint=snapshots.append)
    trajectories = await runner.run(Task(f"t#{seed}", env_id, seed), f"t#{seed}/0")
    return trajectories, snapshots


def test_trajectories_and_checkpoints_round_trip_exactly(tmp_path: Path, tokenizer: Any) -> None:
    trajectories, snapshots = asyncio.run(run_with_checkpoints(tokenizer, "agentrl/GuessNumber-v0"))
    assert len(snapshots) >= 2, "a multi-turn episode checkpoints at every turn boundary"
    with EpisodeStore.open(tmp_path) as store:
        task = Task("t#3", "agentrl/GuessNumber-v0", 3)
        store.add_tasks([task], 1)
        store.episode_started("t#3/0", task, 0, 0)
        store.save_partials([snapshots[1]])
        (back,) = store.partials()
        assert back.meta() == snapshots[1].meta()
        for name, array in back.concatenated().items():
            assert np.array_equal(array, snapshots[1].concatenated()[name], equal_nan=True)
        assert store.episodes()[0]["state"] == "paused"
        store.save_episode(trajectories)
        assert store.partials() == [], "an ended episode's checkpoint is removed"
        (stored,) = store.trajectories("t#3/0")
        assert_same(stored, trajectories[0])
        assert stored.env_log == trajectories[0].env_log
        assert math.isnan(stored.logprobs[0]) and stored.versions[0] == -1
        stats = store.stats()
        assert stats["array_bytes"] == 13 * stats["tokens"], "13 bytes per stored token"
        assert store.integrity_check() == "ok"


def test_an_episode_is_checkpointed_at_its_first_boundary_then_once_per_interval(
    tokenizer: Any,
) -> None:
    """rollout.checkpoint_interval_s: 0 checkpoints every turn boundary; a long interval
    leaves the first boundary's only (so every episode past its first turn can resume);
    a negative one is refused, naming the key."""
    every, snapshots = asyncio.run(run_with_checkpoints(tokenizer, "tests/Counter-v0"))
    assert [s.turn for s in snapshots] == [1, 2, 3], "every boundary of a 4-turn episode"
    once, first_only = asyncio.run(
        run_with_checkpoints(tokenizer, "tests/Counter-v0", interval_s=3600.0)
    )
    assert [s.turn for s in first_only] == [1]
    assert_same(once[0], every[0])  # checkpointing changes nothing in the episode
    with pytest.raises(ConfigError, match=r"rollout\.checkpoint_interval_s"):
        RolloutConfig(checkpoint_interval_s=-1.0)


def test_a_tasks_position_is_found_by_index_in_new_and_older_stores(tmp_path: Path) -> None:
    """Adding a task reads the largest position through an index (it scanned the whole
    tasks table, every task), in a new store and in one made before the index existed
    (given it when opened); a store that cannot be written still opens as it is."""

    def plan(path: Path) -> str:
        db = sqlite3.connect(path)
        rows = db.execute("EXPLAIN QUERY PLAN SELECT MAX(position) FROM tasks").fetchall()
        db.close()
        return " ".join(str(r[-1]) for r in rows)

    new = tmp_path / "new.db"
    EpisodeStore.open(new).close()
    assert "tasks_by_position" in plan(new)

    older = tmp_path / "older.db"
    store = EpisodeStore.open(older)
    store.add_tasks([Task("a", "tests/Counter-v0", 1)], 1)
    store.close()
    db = sqlite3.connect(older)
    db.execute("DROP INDEX tasks_by_position")
    db.close()
    assert "tasks_by_position" not in plan(older)
    store = EpisodeStore.open(older)
    assert store.add_tasks([Task("b", "tests/Counter-v0", 2)], 1) == 1
    assert [t.task_id for t in store.tasks()] == ["a", "b"]
    store.close()
    assert "tasks_by_position" in plan(older)

    # a store that cannot be written (read-only media, another owner): opened as it is
    from agentrl.store.schema import _prepare

    db = sqlite3.connect(older)
    db.execute("DROP INDEX tasks_by_position")
    db.close()
    readonly = sqlite3.connect(f"file:{older}?mode=ro", uri=True)
    _prepare(readonly, older, SCHEMA_VERSION)
    assert readonly.execute("SELECT COUNT(*) FROM tasks").fetchone() == (2,)
    readonly.close()
    assert "tasks_by_position" not in plan(older)


def test_the_store_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    path = tmp_path / "episodes.db"
    EpisodeStore.open(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match=r"newer agentrl \(store schema 2.*upgrade agentrl"):
        EpisodeStore.open(path)
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database at all " * 100)
    with pytest.raises(StoreError, match="not a readable SQLite episode store"):
        EpisodeStore.open(garbage)
    other = tmp_path / "other.db"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE users (name TEXT)")
    db.close()
    with pytest.raises(StoreError, match="not an agentrl episode store"):
        EpisodeStore.open(other)
    assert sqlite3.connect(other).execute("SELECT COUNT(*) FROM users").fetchone() == (0,)
    with pytest.raises(StoreError, match="no episode store"):
        EpisodeStore.open(tmp_path / "missing", create=False)
    # Opening a store that must exist (replay, resume, eval) never makes one: an empty
    # file, or another program's SQLite file, is refused and left byte for byte.
    empty = tmp_path / "empty" / "episodes.db"
    empty.parent.mkdir()
    empty.touch()
    with pytest.raises(StoreError, match="holds no tables and no agentrl episode store"):
        EpisodeStore.open(empty.parent, create=False)
    assert empty.read_bytes() == b"" and sorted(p.name for p in empty.parent.iterdir()) == [
        "episodes.db"
    ]
    before = other.read_bytes()
    with pytest.raises(StoreError, match=r"holds tables \['users'\] but no agentrl"):
        EpisodeStore.open(other, create=False)
    assert other.read_bytes() == before
    EpisodeStore.open(empty).close()  # where the store is to be made, it is
    EpisodeStore.open(empty, create=False).close()


def test_nothing_in_the_store_is_pickled() -> None:
    sources = sorted((Path(__file__).parents[2] / "agentrl" / "store").glob("*.py"))
    assert len(sources) >= 4, "the store package's modules are all read"
    for source in sources:
        assert "pickle" not in source.read_text().replace("Nothing is pickled", ""), source


@pytest.mark.parametrize("env_id", ["agentrl/GuessNumber-v0", "tests/Counter-v0"])
def test_resume_from_any_checkpoint_ends_like_the_uninterrupted_episode(
    tokenizer: Any, env_id: str
) -> None:
    """GuessNumber restores with set_state; Counter has no state and is replayed."""
    whole, snapshots = asyncio.run(run_with_checkpoints(tokenizer, env_id))
    assert snapshots and (snapshots[0].env_state is None) == (env_id == "tests/Counter-v0")
    for snapshot in snapshots:
        client = ScriptedClient(tokenizer, counting_model)
        runner = EpisodeRunner(client, tokenizer, RolloutConfig(max_turns=8))
        resumed = asyncio.run(runner.resume(snapshot))
        assert_same(resumed[0], whole[0])
        assert len(client.calls) == whole[0].turn_rewards.__len__() - snapshot.turn


def test_resume_of_an_env_that_is_not_reproducible_fails_with_a_reason(tokenizer: Any) -> None:
    _, snapshots = asyncio.run(run_with_checkpoints(tokenizer, "tests/Noisy-v0"))
    runner = EpisodeRunner(ScriptedClient(tokenizer, counting_model), tokenizer)
    (result,) = asyncio.run(runner.resume(snapshots[-1]))
    assert result.status == "failed" and result.failure is FailureKind.ENV_REPLAY
    assert result.reason.startswith("env_replay: replaying entry 1 (step)"), result.reason


def test_the_failure_kind_is_stored_and_older_rows_without_it_still_load(
    tmp_path: Path, tokenizer: Any
) -> None:
    _, snapshots = asyncio.run(run_with_checkpoints(tokenizer, "tests/Noisy-v0"))
    runner = EpisodeRunner(ScriptedClient(tokenizer, counting_model), tokenizer)
    (failed,) = asyncio.run(runner.resume(snapshots[-1]))
    assert runner.metrics.counters["failures/env_replay"] == 1
    task = snapshots[-1].task
    with EpisodeStore.open(tmp_path) as store:
        store.add_tasks([task], 1)
        store.save_episode([failed])
        (back,) = store.trajectories(failed.episode_id)
        assert (back.status, back.failure, back.reason) == ("failed", failed.failure, failed.reason)
        # A row written before the kind was a field: its meta has no "failure" key.
        with store.batch() as db:
            db.execute("UPDATE trajectories SET meta = json_remove(meta, '$.failure')")
        (old,) = store.trajectories(failed.episode_id)
        assert old.failure is FailureKind.ENV_REPLAY and old.reason == failed.reason
        with store.batch() as db:  # an old failure whose reason names no known kind
            db.execute("UPDATE trajectories SET meta = json_set(meta, '$.reason', 'it broke')")
        (unknown,) = store.trajectories(failed.episode_id)
        assert unknown.status == "failed" and unknown.failure is None
    line = failed.to_json()
    assert (
        line["failure"] == "env_replay"
        and Trajectory.from_json(line).failure is FailureKind.ENV_REPLAY
    )
    del line["failure"]
    assert Trajectory.from_json(line).failure is FailureKind.ENV_REPLAY


def test_writer_batches_in_order_and_keeps_only_the_newest_checkpoint(
    tmp_path: Path, tokenizer: Any
) -> None:
    trajectories, snapshots = asyncio.run(run_with_checkpoints(tokenizer, "tests/Counter-v0"))
    task = Task("t#3", "tests/Counter-v0", 3)

    async def main() -> None:
        with EpisodeStore.open(tmp_path) as store:
            async with StoreWriter(store, interval_s=60) as writer:
                writer.task(task, 1)
                writer.started("t#3/0", task, 0, 0)
                for s in snapshots:
                    writer.partial(s)
                assert writer.pending == 3, "checkpoints of one episode coalesce"
                await writer.flush()
                assert store.partial("t#3/0").turn == snapshots[-1].turn
                writer.episode(trajectories)
                writer.partial(dataclasses.replace(snapshots[0], attempt=1))  # a later attempt's
            assert store.partial("t#3/0") is not None
            assert store.episodes(state="finished")[0]["episode_id"] == "t#3/0"

    asyncio.run(main())


WRITE_TIMES = {
    "trajectories": "created_at",
    "episodes": "updated_at",
    "partials": "written_at",
    "versions": "published_at",
}
"""The column of each table that holds when a row was written (differs between runs)."""


def test_a_trajectory_encoded_where_it_ended_is_saved_as_it_was_encoded(
    tmp_path: Path, tokenizer: Any
) -> None:
    """A rollout worker encodes an ended episode's row (``encoded``); the store then saves
    those columns rather than encoding the trajectory again, once: a later save encodes."""
    (a,), _ = asyncio.run(run_with_checkpoints(tokenizer, "tests/Counter-v0", 3))
    (b,), _ = asyncio.run(run_with_checkpoints(tokenizer, "tests/Counter-v0", 4))
    assert a.token_ids.tolist() != b.token_ids.tolist()
    with EpisodeStore.open(tmp_path) as store:
        task = Task("t#3", "tests/Counter-v0", 3)
        store.add_tasks([task], 1)
        store.episode_started("t#3/0", task, 0, 0)
        # b's columns remembered for a: what is saved shows which were used
        assert encoded(a, segment_columns(b)) is a
        store.save_episode([a])
        (saved,) = store.trajectories("t#3/0")
        assert saved.token_ids.tolist() == b.token_ids.tolist() and saved.messages == b.messages
        store.save_episode([a])  # remembered once: this save encodes a itself
        (saved,) = store.trajectories("t#3/0")
        assert_same(saved, a)


def table_rows(store: EpisodeStore, tables: tuple[str, ...]) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of ``tables`` but their write times, sorted by the first two columns."""
    db = store._db
    out = {}
    for table in tables:
        names = [
            r[1]
            for r in db.execute(f"PRAGMA table_info({table})")
            if r[1] != WRITE_TIMES.get(table)
        ]
        out[table] = db.execute(f"SELECT {', '.join(names)} FROM {table} ORDER BY 1, 2").fetchall()
    return out


def test_episode_ends_written_together_store_what_writing_them_one_by_one_stores(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer saves consecutive episode ends with one ``save_episodes`` (one statement
    per table for all of them); every row, version range and state is what ``save_episode``
    one at a time writes, and a checkpoint written after the ends is not deleted by them."""
    runs = [
        asyncio.run(run_with_checkpoints(tokenizer, "tests/Counter-v0", seed)) for seed in (3, 4, 5)
    ]
    tasks = [Task(f"t#{seed}", "tests/Counter-v0", seed) for seed in (3, 4, 5)]
    ids = [f"t#{seed}/0" for seed in (3, 4, 5)]
    (stale,) = runs[1][0]
    mask = stale.loss_mask.astype(bool)
    versions = stale.versions.copy()
    versions[mask] = np.where(np.arange(mask.sum()) < mask.sum() // 2, 2, 7)  # under 2, then 7
    runs[1] = ([dataclasses.replace(stale, versions=versions)], runs[1][1])
    ends = [(runs[0][0], False), (runs[1][0], True)]
    retry = dataclasses.replace(runs[1][1][2], attempt=1)  # the retried episode's next attempt

    def rows(store: EpisodeStore) -> dict[str, list[tuple[Any, ...]]]:
        return table_rows(store, ("trajectories", "episodes", "partials"))

    with EpisodeStore.open(tmp_path / "one") as store:
        store.add_tasks(tasks, 1)
        for task, eid in zip(tasks, ids, strict=True):
            store.episode_started(eid, task, 0, 0)
        store.save_partials([snaps[1] for _, snaps in runs])
        for trajectories, retried in ends:
            store.save_episode(trajectories, retried=retried)
        store.save_partials([retry])
        expected = rows(store)

    async def batched() -> dict[str, list[tuple[Any, ...]]]:
        with EpisodeStore.open(tmp_path / "batched") as store:
            calls: list[list[str]] = []
            save = store.save_episodes

            def spy(episodes: Any, **kwargs: Any) -> None:
                calls.append([t[0].episode_id for t, _ in episodes])
                save(episodes, **kwargs)

            monkeypatch.setattr(store, "save_episodes", spy)
            async with StoreWriter(store, interval_s=60) as writer:
                for task, eid in zip(tasks, ids, strict=True):
                    writer.task(task, 1)
                    writer.started(eid, task, 0, 0)
                for _, snaps in runs:
                    writer.partial(snaps[1])
                for trajectories, retried in ends:
                    writer.episode(trajectories, retried=retried)
                writer.partial(retry)  # after the ends: their deletes must not take it
            assert calls == [ids[:2]], "the two ends went in one save_episodes"
            return rows(store)

    got = asyncio.run(batched())
    assert got == expected
    with EpisodeStore.open(tmp_path / "batched") as store:
        db = store._db
        assert db.execute(
            "SELECT min_version, max_version FROM trajectories WHERE episode_id = ?", (ids[1],)
        ).fetchall() == [(2, 7)]
        states = db.execute("SELECT episode_id, state FROM episodes ORDER BY 1").fetchall()
        assert states == [(ids[0], "finished"), (ids[1], "retried"), (ids[2], "paused")]
        partials = db.execute("SELECT episode_id, attempt FROM partials ORDER BY 1").fetchall()
        assert partials == [(ids[1], 1), (ids[2], 0)]


def test_a_batch_of_interleaved_lifecycles_stores_what_each_write_in_order_stores(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer writes a run of task, start, end and group writes kind by kind, one
    statement run each; every row is what writing each op in the order submitted writes
    (task positions, a retried attempt restarted in the same run, groups completed after
    their ends), and checkpoints, drops and versions between runs keep their places."""
    runs = {
        seed: asyncio.run(run_with_checkpoints(tokenizer, "tests/Counter-v0", seed))
        for seed in (3, 4)
    }
    tasks = {seed: Task(f"t#{seed}", "tests/Counter-v0", seed) for seed in (3, 4, 5)}
    ends3 = runs[3][0]
    ends4 = runs[4][0]
    ends4_retry = [dataclasses.replace(t, attempt=1) for t in ends4]
    snap3 = runs[3][1][1]
    snap4_retry = dataclasses.replace(runs[4][1][1], attempt=1)
    snap5_retry = dataclasses.replace(snap3, episode_id="t#5/0", attempt=1, task=tasks[5])
    ops: list[tuple[str, tuple[Any, ...]]] = [
        ("task", (tasks[3], 1)),
        ("started", ("t#3/0", tasks[3], 0, 0)),
        ("task", (tasks[4], 1)),
        ("started", ("t#4/0", tasks[4], 0, 0)),
        ("partial", (snap3,)),
        ("episode", (ends3, False)),
        ("group", (Group(tasks[3], 1, ends3),)),
        ("task", (tasks[5], 1)),
        ("started", ("t#5/0", tasks[5], 0, 0)),
        ("episode", (ends4, True)),
        ("started", ("t#4/0", tasks[4], 1, 0)),
        ("task", (tasks[3], 1)),  # known already: left as it is
        ("dropped", ("t#5/0", 0, "dropped at a weight update")),
        ("started", ("t#5/0", tasks[5], 1, 1)),
        ("partial", (snap5_retry,)),
        ("partial", (snap4_retry,)),  # made moot by its end below, as snap3 is
        ("episode", (ends4_retry, False)),
        ("group", (Group(tasks[4], 1, ends4_retry),)),
        ("version", (1, "full", "here", {"step": 1})),
    ]

    def rows(store: EpisodeStore) -> dict[str, list[tuple[Any, ...]]]:
        return table_rows(store, ("tasks", "trajectories", "episodes", "partials", "versions"))

    one_by_one = {
        "task": lambda store, task, size: store.add_tasks([task], size),
        "started": EpisodeStore.episode_started,
        "partial": lambda store, p: store.save_partials([p]),
        "episode": lambda store, ts, retried: store.save_episode(ts, retried=retried),
        "group": EpisodeStore.complete_group,
        "dropped": EpisodeStore.drop_episode,
        "version": EpisodeStore.record_version,
    }
    with EpisodeStore.open(tmp_path / "one") as store:
        for kind, args in ops:
            one_by_one[kind](store, *args)
        expected = rows(store)

    async def batched() -> tuple[dict[str, list[tuple[Any, ...]]], list[tuple[str, int]]]:
        calls: list[tuple[str, int]] = []
        with EpisodeStore.open(tmp_path / "batched") as store:
            for name in (
                "add_sized_tasks",
                "episodes_started",
                "save_episodes",
                "complete_groups",
                "save_partials",
            ):
                method = getattr(store, name)

                def spy(
                    items: Any, *a: Any, _name: str = name, _method: Any = method, **k: Any
                ) -> Any:
                    calls.append((_name, len(items)))
                    return _method(items, *a, **k)

                monkeypatch.setattr(store, name, spy)
            async with StoreWriter(store, interval_s=60) as writer:
                submit = {
                    "task": writer.task,
                    "started": writer.started,
                    "partial": writer.partial,
                    "group": writer.group,
                    "dropped": writer.dropped,
                    "version": writer.version,
                    "episode": lambda ts, r: writer.episode(ts, retried=r),
                }
                for kind, args in ops:
                    submit[kind](*args)
            return rows(store), calls

    got, calls = asyncio.run(batched())
    assert got == expected
    assert calls == [
        ("add_sized_tasks", 4),
        ("episodes_started", 4),
        ("save_episodes", 2),
        ("complete_groups", 1),  # then the drop
        ("episodes_started", 1),
        ("save_partials", 1),
        ("save_episodes", 1),
        ("complete_groups", 1),  # then the version
    ], "each run's writes of a kind went in one call, the runs in the order submitted"
    assert [(r[0], r[1]) for r in got["partials"]] == [("t#5/0", 1)]
    assert [r[0] for r in got["tasks"]] == ["t#3", "t#4", "t#5"]
    assert [r[1] for r in got["tasks"]] == [0, 1, 2], "positions in the order submitted"


def test_crash_mid_run_then_resume_runs_every_task_exactly_once(
    tmp_path: Path, tokenizer: Any
) -> None:
    """Cancel a run part-way (as a kill would stop it), then resume from the store."""
    tasks = list(tasks_for("tests/Counter-v0", 12))
    config = RolloutConfig(concurrency=6, group_size=3)

    async def run(resume: bool, stop_after: int | None) -> Scheduler:
        with EpisodeStore.open(tmp_path) as store:
            async with StoreWriter(store, interval_s=0.01) as writer:
                client = ScriptedClient(tokenizer, counting_model)
                enough = asyncio.Event()

                def checkpoint(partial: PartialEpisode) -> None:
                    writer.partial(partial)
                    # stop once enough groups are done, at a moment when this episode
                    # is still at least two turns from its end (so it is caught part-way)
                    done = stop_after is not None and scheduler.groups_done >= stop_after
                    if done and partial.turn <= 2:
                        enough.set()

                runner = EpisodeRunner(client, tokenizer, checkpoint=checkpoint)
                scheduler = Scheduler(
                    runner, TrajectoryQueue(100), config, writer=writer, resume=resume
                )
                if stop_after is None:
                    await scheduler.run(tasks)
                    return scheduler
                job = asyncio.create_task(scheduler.run(tasks))
                await enough.wait()
                job.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await job
                return scheduler

    asyncio.run(run(False, stop_after=4))
    with EpisodeStore.open(tmp_path) as store:
        done_before = set(store.task_states().values())
        assert "complete" in done_before and len(store.partials()) > 0
    scheduler = asyncio.run(run(True, None))
    assert scheduler.metrics.counters["episodes_from_store"] > 0
    assert scheduler.metrics.counters["episodes_resumed"] > 0
    with EpisodeStore.open(tmp_path) as store:
        assert store.task_states() == {t.task_id: "complete" for t in tasks}
        groups = store.untrained_groups()
        assert [g.task.task_id for g in groups] == [t.task_id for t in tasks]
        assert all(g.complete and len(g.trajectories) == 3 for g in groups)
        assert store.partials() == []
        store.mark_consumed(groups[:2], step=0)
        store.mark_consumed(groups[2:5], step=1)
        assert len(store.untrained_groups()) == 7 and store.last_step() == 1
        with pytest.raises(ValueError, match="only once"):
            store.mark_consumed(groups[:1], step=2)
        assert store.integrity_check() == "ok"

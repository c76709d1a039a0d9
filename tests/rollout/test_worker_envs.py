"""Rollout workers with envs on env servers: each worker's own pool (real servers).

Two real ``agentrl serve-env`` processes serve ``bench/Echo-v0``; two worker processes
run the episodes (the engine is the fake ``SlowClient`` of test_workers: the seam under
test is the worker's way to the env servers). With moving servers (``targets``), each
worker's relays follow :meth:`WorkerRunner.retarget`.
"""

from __future__ import annotations

import contextlib
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from agentrl.config import EnvConfig, ModelConfig, RolloutConfig
from agentrl.queue import TrajectoryQueue
from agentrl.rollout import Scheduler, tasks_for
from agentrl.rollout.envside import REPLAY_CHECKS
from agentrl.rollout.workers import WorkerRunner, open_runner
from agentrl.runtime.metrics import Metrics
from agentrl.store import EpisodeStore, StoreWriter
from tests.remote.servers import serve_env
from tests.rollout.test_workers import SlowClient, tokenizer  # noqa: F401

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).parents[2]
CHECKS = REPLAY_CHECKS * 2
"""Sessions of the replay checks: each of the two workers replays its first episodes."""
TURNS = json.dumps({"turns": 2})  # the servers build the envs: their kwargs are given there


@pytest.fixture
def two_servers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the env's entry point is benchmarks.common
    started = []
    try:
        for _ in range(2):
            started.append(
                serve_env(
                    "bench/Echo-v0", tmp_path, "--import", "benchmarks.common", "--kwargs", TURNS
                )
            )
        yield [url for _, url in started]
    finally:
        for proc, _ in started:
            proc.kill()


def sessions(url: str) -> int:
    """Sessions the server has opened so far (its own counter)."""
    with urllib.request.urlopen(f"{url}/agentrl", timeout=10) as r:
        return int(json.load(r)["counters"].get("sessions", 0))


async def _episodes(
    runner: Any, store: EpisodeStore, writer: StoreWriter, n: int, first: int = 0
) -> list[Any]:
    rollout = runner.config
    queue = TrajectoryQueue(n + 1)
    tasks = list(tasks_for("bench/Echo-v0", first + n))[first:]
    await Scheduler(runner, queue, rollout, writer=writer).run(tasks)
    await writer.flush()
    return [t for g in queue._groups for t in g.trajectories]


def _rollout() -> RolloutConfig:
    return RolloutConfig(
        max_turns=2, max_tokens_per_turn=8, ignore_eos=True, workers=2, group_size=1, concurrency=8
    )


async def _open(
    stack: contextlib.AsyncExitStack,
    tokenizer: Any,  # noqa: F811
    writer: StoreWriter,
    **env: Any,
) -> Any:
    """Two workers on the fake engine; ``env``: open_runner's env servers arguments."""
    return await open_runner(
        stack,
        SlowClient(tokenizer),
        tokenizer,
        _rollout(),
        model=ModelConfig(),
        imports=(),  # the workers never import the env: the servers run it
        metrics=Metrics(),
        checkpoint=writer.partial,
        **env,
    )


async def test_workers_run_their_episodes_on_the_env_servers(
    tokenizer: Any,  # noqa: F811
    two_servers: list[str],
    tmp_path: Path,
) -> None:
    env = EnvConfig(id="bench/Echo-v0", urls=two_servers)
    store = EpisodeStore.open(tmp_path / "store")
    async with StoreWriter(store) as writer, contextlib.AsyncExitStack() as stack:
        runner = await _open(
            stack,
            tokenizer,
            writer,
            make=lambda *a, **k: None,  # the main process's pool (unused by the workers)
            env=env,
        )
        assert isinstance(runner, WorkerRunner)
        done = await _episodes(runner, store, writer, 16)
    assert len(done) == 16
    assert all(t.status == "finished" for t in done), [(t.status, t.reason) for t in done][:2]
    assert all(len(t.turn_rewards) == 2 for t in done)
    opened = [sessions(u) for u in two_servers]
    # one session per episode, on both servers, and each worker's replay checks
    assert sum(opened) == 16 + CHECKS and min(opened) > 0, opened


async def test_worker_relays_follow_a_server_that_moves(
    tokenizer: Any,  # noqa: F811
    two_servers: list[str],
    tmp_path: Path,
) -> None:
    """A server that may move (a Ray actor) is reached through the worker's own relay,
    aimed at ``targets``; :meth:`retarget` moves it, and None takes a server out."""
    addresses = [("127.0.0.1", int(u.rsplit(":", 1)[1])) for u in two_servers]
    # env.urls stand for the main process's relays: the workers replace them with theirs
    env = EnvConfig(id="bench/Echo-v0", urls=["http://10.255.255.1:1", "http://10.255.255.1:2"])
    store = EpisodeStore.open(tmp_path / "store")
    async with StoreWriter(store) as writer, contextlib.AsyncExitStack() as stack:
        runner = await _open(
            stack,
            tokenizer,
            writer,
            env=env,
            env_targets=[addresses[0], None],  # server 1 down (or not placed yet)
        )
        assert isinstance(runner, WorkerRunner)
        first = await _episodes(runner, store, writer, 8)
        after_first = [sessions(u) for u in two_servers]
        runner.retarget([None, addresses[1]])  # server 0 went down; 1 is up somewhere
        second = await _episodes(runner, store, writer, 8, first=8)
        after_second = [sessions(u) for u in two_servers]
    assert [t.status for t in first + second] == ["finished"] * 16
    assert after_first[0] >= 8 and after_first[1] == 0, after_first  # all on server 0
    assert after_second[0] == after_first[0] and after_second[1] >= 8, after_second  # now on 1
    assert sum(after_second) == 16 + CHECKS, after_second

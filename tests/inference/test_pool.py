"""Two real ``vllm serve`` servers behind the router; one is killed mid-run.

Proves: episodes keep their server while it is healthy; new episodes spread by load;
a SIGKILLed server's requests continue on the other one from the exact prefix, so
every sampled token is in a trajectory; weight updates reach every live server; the
dead server (started by agentrl) is restarted, brought to the current version before
it takes requests again, and serves again.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from agentrl.errors import EngineError
from agentrl.inference import InferenceConfig, ServerPool, VLLMServer
from agentrl.queue import TrajectoryQueue
from agentrl.rollout import EpisodeRunner, RolloutConfig, Scheduler, tasks_for
from agentrl.rollout.controller import RolloutController

pytestmark = [pytest.mark.timeout(600)]

CONFIG = InferenceConfig(max_model_len=512, kv_cache_mib=64, max_num_seqs=64, startup_timeout_s=240)


async def until(predicate: Any, what: str, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def _episode(request_id: str) -> str:
    return request_id.rsplit("-", 1)[0]


@pytest.mark.vllm
@pytest.mark.soak  # about 2 minutes on 2 cores: in `make soak`, out of `make test`
async def test_killed_server_fails_over_restarts_and_catches_up(
    tiny_model: Path, perturbed_weights: Path, tokenizer: Any, tmp_path: Path
) -> None:
    config = CONFIG
    servers = await asyncio.gather(
        *(VLLMServer.start(str(tiny_model), config, log_dir=tmp_path / "logs") for _ in range(2))
    )
    victim, survivor = servers
    try:
        pool = ServerPool(
            [s.url for s in servers],
            config,
            managed={s.url: s for s in servers},
            health_interval_s=0.5,
            reconnect_timeout_s=240,
            max_restarts=1,
        )
        async with pool:
            queue = TrajectoryQueue(1000)
            rollout = RolloutConfig(max_turns=4, max_tokens_per_turn=48)
            runner = EpisodeRunner(pool, tokenizer, rollout)
            controller = RolloutController(runner, policy="resume")
            scheduler = Scheduler(runner, queue, RolloutConfig(concurrency=24, group_size=2))
            job = asyncio.create_task(scheduler.run(tasks_for("agentrl/GuessNumber-v0", 48)))

            # Let both servers sample, then kill one with requests in flight on it.
            await until(
                lambda: {u for _, u in pool.routes} >= {victim.url, survivor.url},
                "both servers to get requests",
            )
            await until(
                lambda: any(m.url == victim.url and m.load for m in pool.members),
                "a request in flight on the victim",
            )
            os.killpg(victim.pid, signal.SIGKILL)
            killed_at = len(pool.routes)
            await until(lambda: any(e.event == "down" for e in pool.events), "the down event")
            update = await controller.update_weights(str(perturbed_weights))
            assert update.version == 1 and pool.version == 1
            await job
            # The victim is started again and loads version 1 before it takes requests.
            await until(lambda: any(e.event == "up" for e in pool.events), "the victim back")
            back_at = len(pool.routes)
            again = TrajectoryQueue(100)
            more = Scheduler(runner, again, RolloutConfig(concurrency=16, group_size=2))
            await more.run(tasks_for("agentrl/GuessNumber-v0", 8, first_seed=1000))
            extra = [t for _ in range(len(again)) for t in (await again.get()).trajectories]
    finally:
        await asyncio.gather(*(s.stop() for s in servers))

    groups = [await queue.get() for _ in range(len(queue))]
    trajectories = [t for g in groups for t in g.trajectories]
    assert len(groups) == 48 and all(g.complete for g in groups)
    assert len(extra) == 16
    # Nothing lost: every token a server returned is in a trajectory.
    sampled = sum(t.num_sampled for t in trajectories + extra)
    assert runner.metrics.counters["tokens_sampled"] == sampled
    assert all(t.status != "failed" for t in trajectories), [t.reason for t in trajectories]

    events = [(e.url, e.event) for e in pool.events]
    assert (victim.url, "down") in events and (victim.url, "restarted") in events, events
    assert events.index((victim.url, "down")) < events.index((victim.url, "up"))
    assert victim.restarts == 1
    states = {row["url"]: row for row in pool.describe()}
    assert states[victim.url]["up"] and states[victim.url]["version"] == 1, states
    assert states[survivor.url]["version"] == 1

    routes = list(pool.routes)
    before, after = routes[:killed_at], routes[killed_at:]
    # Affinity: before the kill, each episode's turns went to one server.
    servers_of = collections.defaultdict(set)
    for rid, url in before:
        servers_of[_episode(rid)].add(url)
    assert sum(len(s) == 1 for s in servers_of.values()) == len(servers_of)
    # Load balancing: both servers got episodes.
    assert {u for s in servers_of.values() for u in s} == {victim.url, survivor.url}
    # From the moment it was found down until it was back at v1: only the survivor.
    down = next(e for e in pool.events if e.event == "down")
    up = next(e for e in pool.events if e.event == "up")
    assert after and down.routed < up.routed
    assert {u for _, u in routes[down.routed : up.routed]} == {survivor.url}
    # Back in the rotation at version 1: it serves new episodes, tokens labelled 1.
    assert victim.url in {u for _, u in routes[back_at:]}
    assert all(set(t.versions[t.loss_mask.astype(bool)].tolist()) == {1} for t in extra)


@pytest.mark.vllm
async def test_no_server_left_stops_with_a_clear_message(tiny_model: Path, tmp_path: Path) -> None:
    """An external server (not ours: no restart) dies; requests wait, then a clear error."""
    config = CONFIG
    server = await VLLMServer.start(str(tiny_model), config, log_dir=tmp_path / "logs")
    try:
        async with ServerPool(
            [server.url], config, health_interval_s=0.2, reconnect_timeout_s=3
        ) as pool:
            from agentrl.inference import SamplingConfig

            gen = await pool.generate([1, 2, 3], SamplingConfig(max_tokens=4), "ep-0")
            assert len(gen.token_ids) == 4 and gen.finish_reason == "length"
            os.killpg(server.pid, signal.SIGKILL)
            with pytest.raises(EngineError) as err:
                await pool.generate([1, 2, 3], SamplingConfig(max_tokens=4), "ep-1")
    finally:
        await server.stop()
    message = str(err.value)
    assert "no inference server answered for 3 s" in message
    assert server.url in message and "agentrl train --resume" in message


async def test_requests_waiting_for_a_server_end_promptly_when_aborted_or_cancelled() -> None:
    """No server at all (nothing listens): waiting requests obey abort, deadline, cancel."""
    from agentrl.inference import SamplingConfig
    from agentrl.inference.server import free_port

    url = f"http://127.0.0.1:{free_port()}"
    sampling = SamplingConfig(max_tokens=4)
    async with ServerPool(
        [url], InferenceConfig(), health_interval_s=0.1, reconnect_timeout_s=2
    ) as pool:
        waiting = asyncio.create_task(pool.generate([1, 2], sampling, "ep-a-0"))
        await until(lambda: "ep-a-0" in pool.requests.ids() and pool.events, "a waiter", 10)
        t0 = time.monotonic()
        aborted = await pool.abort("ep-a-0")
        gen = await waiting
        assert aborted is not None and gen.finish_reason == "abort" and not gen.token_ids
        assert time.monotonic() - t0 < 0.5
        # 32 at once: each stops after reconnect_timeout_s with the clear error.
        t0 = time.monotonic()
        with pytest.raises(ExceptionGroup) as group:
            async with asyncio.TaskGroup() as tg:
                for i in range(32):
                    tg.create_task(pool.generate([1, 2], sampling, f"ep-{i}-0"))
        assert time.monotonic() - t0 < 10
        assert all(isinstance(e, EngineError) for e in group.value.exceptions)
        assert "no inference server answered for 2 s" in str(group.value.exceptions[0])
        # Cancelling a waiter ends it at once (a task group cancelling its children).
        waiter = asyncio.create_task(pool.generate([1, 2], sampling, "ep-c-0"))
        await asyncio.sleep(0.3)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(waiter, 1.0)
        assert len(pool.requests) == 0
    assert pool.describe()[0]["up"] is False
    # What `agentrl top` and the plain progress lines show about it.
    from agentrl.monitor import headline, plain_line

    status = {"servers": pool.describe()}
    label, line = headline(status)[-1]
    assert label == "servers" and line.startswith("0/1 up") and f"{url} DOWN (" in line
    assert plain_line(status).endswith("servers 0/1 up")


async def test_a_crashed_health_check_is_raised_to_callers_and_on_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A health loop that dies of a non-network error does not end silently."""
    from agentrl.inference import SamplingConfig
    from agentrl.inference.server import free_port

    url = f"http://127.0.0.1:{free_port()}"
    sampling = SamplingConfig(max_tokens=4)
    bug = RuntimeError("a bug in the health check")

    async def broken(timeout_s: float = 2.0) -> bool:
        raise bug

    pool = ServerPool([url], InferenceConfig(), health_interval_s=0.1, reconnect_timeout_s=60)
    monkeypatch.setattr(pool.members[0].client, "healthy", broken)
    with pytest.raises(EngineError) as on_close:
        async with pool:
            await until(lambda: pool._health is not None and pool._health.done(), "the crash", 10)
            t0 = time.monotonic()
            with pytest.raises(EngineError) as on_generate:
                await asyncio.wait_for(pool.generate([1, 2], sampling, "ep-a-0"), 5)
            with pytest.raises(EngineError) as on_update:
                await pool.reload_weights("/no/such/weights")
            assert time.monotonic() - t0 < 1.0  # at once, not after reconnect_timeout_s
            assert len(pool.requests) == 0
    for err in (on_generate, on_update, on_close):
        assert err.value.__cause__ is bug
        assert "health checks crashed (RuntimeError: a bug in the health check" in str(err.value)
        assert "agentrl train --resume" in str(err.value)
    await pool.close()  # safe twice: the error was reported once


async def test_a_request_waiting_for_a_server_ends_when_the_health_check_crashes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No server: the waiter would wait for a recovery that will never run."""
    from agentrl.inference import SamplingConfig
    from agentrl.inference.server import free_port

    url = f"http://127.0.0.1:{free_port()}"
    pool = ServerPool([url], InferenceConfig(), health_interval_s=0.1, reconnect_timeout_s=60)
    crash = asyncio.Event()

    async def recover(member: Any) -> None:
        await crash.wait()
        raise RuntimeError("recovery crashed")

    monkeypatch.setattr(pool, "_recover", recover)
    with pytest.raises(EngineError, match="recovery crashed"):
        async with pool:
            waiting = asyncio.create_task(pool.generate([1, 2], SamplingConfig(), "ep-b-0"))
            await until(lambda: "ep-b-0" in pool.requests.ids() and pool.events, "a waiter", 10)
            t0 = time.monotonic()
            crash.set()
            with pytest.raises(EngineError, match="recovery crashed"):
                await asyncio.wait_for(waiting, 5)
            assert time.monotonic() - t0 < 2.0

"""Remote envs under load and under faults (fast: a scripted policy, no vLLM).

Every run here is the real :class:`EpisodeRunner`, :class:`Scheduler` and
:class:`StoreWriter` (a real SQLite episode store) with ``make=pool.make`` of an
:class:`EnvServerPool`; the env servers are ``agentrl serve-env`` subprocesses, or, for
servers that misbehave, a small OpenEnv-speaking server in the test's own event loop.
Checked:

* 256 concurrent episodes over two servers all finish (a bisecting policy finds every
  number), their sessions spread over both servers, and every session is closed.
* One of two servers SIGKILLed mid-run: only its in-flight episodes fail, with
  ``env_unavailable`` naming it; they are retried on the other server; every group is
  complete, no episode is lost or counted twice, the store agrees.
* A server that never answers a step fails that episode with ``env_timeout`` naming
  ``env.request_timeout_s``; one whose answers are not the protocol fails it with
  ``env_protocol`` saying what came; the other episodes of the run finish.
* No server left: the run stops with one :class:`EnvServersUnavailable` after
  ``env.reconnect_timeout_s`` that names the server and what to do; the store is
  intact and a resumed run on a new server completes every task.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiohttp import WSMsgType, web

import envs  # noqa: F401  (registers the shipped envs)
from agentrl.config import EnvConfig, RolloutConfig
from agentrl.errors import EnvServersUnavailable
from agentrl.inference.base import Generation, SamplingConfig
from agentrl.queue import TrajectoryQueue
from agentrl.remote import EnvServerPool
from agentrl.rollout import EpisodeRunner, Scheduler, tasks_for
from agentrl.run import explain_failure
from agentrl.store import EpisodeStore, StoreWriter
from agentrl.types import Group, Task
from tests.faults.harness import wait_until
from tests.faults.test_episode_faults import Run, assert_accounted
from tests.remote.servers import serve_env
from tests.rollout.fakes import ScriptedClient

pytestmark = pytest.mark.timeout(100)

GUESS = "agentrl/GuessNumber-v0"
GROUP_SIZE = 2
BAD_SEED = 1


class PacedClient(ScriptedClient):
    """The scripted client, each turn taking ``delay_s`` (so episodes are in flight when
    a server is killed)."""

    def __init__(self, tokenizer: Any, delay_s: float = 0.0, **kwargs: Any) -> None:
        super().__init__(tokenizer, self.bisect, max_model_len=1024, **kwargs)
        self.delay_s = delay_s
        self.turns_done = 0
        self._waiters: list[tuple[int, asyncio.Event]] = []

    def after_turns(self, count: int) -> asyncio.Event:
        """An event set once ``count`` turns have been sampled."""
        event = asyncio.Event()
        self._waiters.append((count, event))
        return event

    def bisect(self, prompt_ids: Sequence[int]) -> str:
        """GuessNumber's best policy: bisect 1..100 by the feedback so far (7 guesses)."""
        low, high = 1, 100
        for word in re.findall(r"\b(Higher|Lower)\.", self.tokenizer.decode(list(prompt_ids))):
            middle = (low + high) // 2
            low, high = (middle + 1, high) if word == "Higher" else (low, middle - 1)
        return f"Guess: {(low + high) // 2}"

    async def generate(
        self, prompt_token_ids: Sequence[int], sampling: SamplingConfig, request_id: str
    ) -> Generation:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        generation = await super().generate(prompt_token_ids, sampling, request_id)
        self.turns_done += 1
        for count, event in self._waiters:
            if self.turns_done >= count:
                event.set()
        return generation


@contextlib.asynccontextmanager
async def remote_run(
    client: ScriptedClient,
    env: EnvConfig,
    store_dir: Path,
    *,
    concurrency: int,
    resume: bool = False,
    on_group: Callable[[Group], Any] | None = None,
) -> AsyncIterator[tuple[EnvServerPool, Scheduler, EpisodeRunner, TrajectoryQueue]]:
    """A scheduler whose episodes run on the servers of ``env``, writing to a store."""
    config = RolloutConfig(
        group_size=GROUP_SIZE,
        concurrency=concurrency,
        max_retries=1,
        max_turns=8,
        env_timeout_s=30.0,
    )
    store = EpisodeStore.open(store_dir)
    try:
        async with EnvServerPool.from_config(env) as pool, StoreWriter(store) as writer:
            runner = EpisodeRunner(
                client, client.tokenizer, config, make=pool.make, checkpoint=writer.partial
            )
            queue = TrajectoryQueue(1000)
            scheduler = Scheduler(
                runner, queue, config, writer=writer, resume=resume, on_group=on_group
            )
            yield pool, scheduler, runner, queue
    finally:
        store.close()


async def collect(scheduler: Scheduler, runner: EpisodeRunner, queue: TrajectoryQueue) -> Run:
    groups = [await queue.get() for _ in range(len(queue))]
    return Run(groups, scheduler, runner, runner.client)  # type: ignore[arg-type]


def stored(store_dir: Path) -> dict[str, Any]:
    """What the episode store holds: its audit and integrity check."""
    with EpisodeStore.open(store_dir, create=False) as store:
        return {"integrity": store.integrity_check(), **store.audit()}


def leaves(error: BaseException) -> list[BaseException]:
    """The errors inside (nested) exception groups, cancellations left out."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for e in error.exceptions for leaf in leaves(e)]
    return [] if isinstance(error, asyncio.CancelledError) else [error]


def sessions_open(url: str) -> int:
    import urllib.request

    with urllib.request.urlopen(f"{url}/agentrl", timeout=5) as r:
        return int(json.loads(r.read())["sessions"])


def env_config(urls: list[str], **kwargs: Any) -> EnvConfig:
    base = {"request_timeout_s": 10.0, "reconnect_timeout_s": 30.0, "health_interval_s": 0.2}
    return EnvConfig(urls=urls, **(base | kwargs))


# --- load and server death ---------------------------------------------------------------


async def test_256_concurrent_remote_episodes_spread_over_two_servers(
    tokenizer: Any, tmp_path: Path, record_fault: Any
) -> None:
    """128 groups of 2 at concurrency 256 over two serve-env processes: every episode
    finds its number, both servers took a fair share of the sessions, all closed after."""
    servers = [serve_env(GUESS, tmp_path)[1] for _ in range(2)]
    client = PacedClient(tokenizer)
    tasks = 128
    async with remote_run(
        client, env_config(servers, id=GUESS), tmp_path / "run", concurrency=256
    ) as (pool, scheduler, runner, queue):
        await asyncio.wait_for(scheduler.run(tasks_for(GUESS, tasks)), 90)
        run = await collect(scheduler, runner, queue)
        opened = [row["opened"] for row in pool.describe()]
    ids = [t.episode_id for t in run.final]
    record_fault(
        "256 concurrent remote episodes on 2 env servers",
        injected=0,
        runs=1,
        survived=int(all(g.complete for g in run.groups) and len(run.groups) == tasks),
        lost=tasks * GROUP_SIZE - len(set(ids)),
        trained_twice=len(ids) - len(set(ids)),
    )

    assert_accounted(run, tasks)
    outcomes = {(t.status, t.reason, t.reward) for t in run.final}
    assert outcomes == {("finished", "found it", 1.0)}, outcomes
    assert run.counters["episode_retries"] == 0
    assert sum(opened) >= tasks * GROUP_SIZE and min(opened) >= sum(opened) // 4, opened
    for url in servers:  # every session was closed on the server too
        wait_until(lambda url=url: sessions_open(url) == 0, f"{url} to close its sessions", 10)
    assert stored(tmp_path / "run")["episodes_by_state"] == {"finished": tasks * GROUP_SIZE}


async def test_a_killed_env_server_fails_only_its_episodes_and_they_are_retried_elsewhere(
    tokenizer: Any, tmp_path: Path, record_fault: Any
) -> None:
    """SIGKILL one of two servers mid-run: its in-flight episodes fail with
    env_unavailable naming it and finish on the other server; nothing lost or doubled."""
    (killed, dead_url), (_, live_url) = (serve_env(GUESS, tmp_path) for _ in range(2))
    client = PacedClient(tokenizer, delay_s=0.02)
    tasks = 48
    async with remote_run(
        client, env_config([dead_url, live_url], id=GUESS), tmp_path / "run", concurrency=96
    ) as (pool, scheduler, runner, queue):
        dead, live = pool.members
        running = asyncio.create_task(scheduler.run(tasks_for(GUESS, tasks)), name="run")
        try:
            await asyncio.wait_for(client.after_turns(100).wait(), 30)
            on_dead, live_opened = dead.load, live.sessions
            killed.kill()
            await asyncio.wait_for(asyncio.shield(running), 60)
        finally:
            running.cancel()
        run = await collect(scheduler, runner, queue)
        rows = {row["url"]: row for row in pool.describe()}
    failed = run.scheduler.failed_attempts
    ids = [t.episode_id for t in run.final]
    record_fault(
        "1 of 2 env servers SIGKILLed mid-run",
        injected=1,
        survived=int(all(g.complete for g in run.groups) and len(run.groups) == tasks),
        lost=tasks * GROUP_SIZE - len(set(ids)),
        trained_twice=len(ids) - len(set(ids)),
    )

    assert_accounted(run, tasks)
    assert {(t.status, t.reason) for t in run.final} == {("finished", "found it")}
    assert 1 <= len(failed) <= on_dead, (len(failed), on_dead)
    for t in failed:
        assert t.failure == "env_unavailable", (t.failure, t.reason)
        assert t.reason.startswith("env_unavailable: ") and dead_url in t.reason, t.reason
    retried = {t.episode_id for t in failed}
    assert {t.episode_id: t.attempt for t in run.final if t.episode_id in retried} == {
        e: 1 for e in retried
    }
    assert rows[dead_url]["up"] is False and rows[dead_url]["lost"] >= len(failed), rows
    assert rows[live_url]["up"] is True and rows[live_url]["lost"] == 0, rows
    assert live.sessions - live_opened >= len(failed), (live.sessions, live_opened)
    store = stored(tmp_path / "run")
    assert store["integrity"] == "ok"
    assert store["episodes_by_state"] == {"finished": tasks * GROUP_SIZE, "retried": len(failed)}, (
        store
    )


# --- servers that misbehave ---------------------------------------------------------------

FAKE_ID = "tests/RemoteFault-v0"


class MisbehavingServer:
    """A small OpenEnv server in the test's loop: a one-step env whose step of task
    ``BAD_SEED`` meets ``fault``: ``hang`` (never answered), ``not_json``,
    ``wrong_type`` (a state message) or ``no_observation`` (a result without one)."""

    def __init__(self, fault: str) -> None:
        self.fault = fault
        self.release = asyncio.Event()
        self.bad_steps = 0
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> str:
        app = web.Application()
        app.router.add_get("/health", lambda r: web.json_response({"status": "healthy"}))
        app.router.add_get(
            "/agentrl",
            lambda r: web.json_response(
                {
                    "protocol": 1,
                    "env_id": FAKE_ID,
                    "sessions": 0,
                    "max_sessions": 64,
                    "supports_state": False,
                }
            ),
        )
        app.router.add_get("/ws", self._ws)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        assert self._runner is not None
        await self._runner.cleanup()

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        seed = None
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                break
            message = json.loads(msg.data)
            if message["type"] == "reset":
                seed = message["data"].get("seed")
                await ws.send_json(self._result(f"Task {seed}: say something.", None, False))
            elif message["type"] == "step" and seed == BAD_SEED:
                self.bad_steps += 1
                await self._misbehave(ws)
            elif message["type"] == "step":
                await ws.send_json(self._result("Done.", 1.0, True))
            else:
                break
        return ws

    async def _misbehave(self, ws: web.WebSocketResponse) -> None:
        if self.fault == "hang":
            await self.release.wait()
        elif self.fault == "not_json":
            await ws.send_str("<html>502 Bad Gateway</html>")
        elif self.fault == "wrong_type":
            await ws.send_json({"type": "state", "data": {"step_count": 1}})
        elif self.fault == "no_observation":
            await ws.send_json({"type": "observation", "data": {"reward": 1.0, "done": True}})

    @staticmethod
    def _result(text: str, reward: float | None, done: bool) -> dict[str, Any]:
        observation = {
            "text": text,
            "messages": None,
            "truncated": False,
            "info": {},
            "env_state": None,
            "system_prompt": None,
            "tool_specs": [],
        }
        return {
            "type": "observation",
            "data": {"observation": observation, "reward": reward, "done": done},
        }


MISBEHAVIOURS = [
    pytest.param(
        "hang",
        "env_timeout",
        "did not answer step within 0.5 s (env.request_timeout_s)",
        id="hangs",
    ),
    pytest.param(
        "not_json",
        "env_protocol",
        "answered step with a malformed message: not JSON",
        id="not-json",
    ),
    pytest.param(
        "wrong_type",
        "env_protocol",
        "answered step with a 'state' message (expected 'observation')",
        id="wrong-message-type",
    ),
    pytest.param(
        "no_observation",
        "env_protocol",
        "sent a malformed step result: no observation object",
        id="no-observation",
    ),
]


@pytest.mark.parametrize(("fault", "kind", "detail"), MISBEHAVIOURS)
async def test_a_misbehaving_server_fails_only_the_episodes_it_met(
    tokenizer: Any, tmp_path: Path, record_fault: Any, fault: str, kind: str, detail: str
) -> None:
    """The bad task's episodes fail (and their retries) with ``kind`` and a reason that
    says what the server did and names it; the run goes on, the other tasks finish."""
    client = ScriptedClient(tokenizer, lambda p: "Hello.", max_model_len=512)
    tasks = [Task(f"fake#{seed}", FAKE_ID, seed) for seed in range(3)]
    async with MisbehavingServer(fault) as url:
        env = env_config([url], id=FAKE_ID, request_timeout_s=0.5)
        async with remote_run(client, env, tmp_path / "run", concurrency=8) as (
            _,
            scheduler,
            runner,
            queue,
        ):
            await asyncio.wait_for(scheduler.run(tasks), 60)
            run = await collect(scheduler, runner, queue)
    bad = [t for t in run.final if t.seed == BAD_SEED]
    record_fault(
        f"env server answers a step: {fault.replace('_', ' ')}",
        injected=1,
        survived=int(len(run.groups) == 3 and all(g.complete for g in run.groups)),
        lost=3 * GROUP_SIZE - len({t.episode_id for t in run.final}),
    )

    assert_accounted(run, 3)
    for t in [*bad, *run.scheduler.failed_attempts]:
        assert t.status == "failed" and t.failure == kind, (t.status, t.failure, t.reason)
        assert t.reason.startswith(f"{kind}: ") and detail in t.reason, t.reason
        assert url in t.reason, t.reason
    assert len(run.scheduler.failed_attempts) == len(bad) == GROUP_SIZE
    others = [(t.seed, t.status, t.reward) for t in run.final if t.seed != BAD_SEED]
    assert sorted(others) == [(0, "finished", 1.0)] * GROUP_SIZE + [(2, "finished", 1.0)] * (
        GROUP_SIZE
    ), others


# --- no server left -----------------------------------------------------------------------


async def test_no_server_left_stops_the_run_clearly_and_resume_completes_it(
    tokenizer: Any, tmp_path: Path, record_fault: Any
) -> None:
    """The only server SIGKILLed mid-run: after env.reconnect_timeout_s the run stops
    with one EnvServersUnavailable naming it and how to go on; the store is intact and
    a resumed run on a new server completes every task, none twice."""
    proc, url = serve_env(GUESS, tmp_path)
    client = PacedClient(tokenizer, delay_s=0.02)
    tasks = list(tasks_for(GUESS, 24))
    env = env_config([url], id=GUESS, reconnect_timeout_s=1.0)
    two_groups, done = asyncio.Event(), []

    def on_group(group: Group) -> None:
        done.append(group)
        if len(done) >= 2:
            two_groups.set()

    async with remote_run(client, env, tmp_path / "run", concurrency=16, on_group=on_group) as (
        _,
        scheduler,
        runner,
        queue,
    ):
        running = asyncio.create_task(scheduler.run(tasks), name="run")
        try:
            await asyncio.wait_for(two_groups.wait(), 30)
            proc.kill()
            killed_at = time.monotonic()
            with pytest.raises(BaseExceptionGroup) as stopped:
                await asyncio.wait_for(asyncio.shield(running), 30)
            waited_s = time.monotonic() - killed_at
        finally:
            running.cancel()
    causes = leaves(stopped.value)
    message = str(explain_failure(stopped.value, tmp_path / "run"))  # what the CLI prints
    stored_then = stored(tmp_path / "run")

    _, resumed_url = serve_env(GUESS, tmp_path)
    with EpisodeStore.open(tmp_path / "run", create=False) as store:
        states = store.task_states()
    todo = [t for t in tasks if states.get(t.task_id, "pending") == "pending"]
    resumed_client = PacedClient(tokenizer)
    async with remote_run(
        resumed_client,
        env_config([resumed_url], id=GUESS),
        tmp_path / "run",
        concurrency=16,
        resume=True,
    ) as (_, scheduler, runner, queue):
        await asyncio.wait_for(scheduler.run(todo), 60)
        resumed = await collect(scheduler, runner, queue)
    end = stored(tmp_path / "run")
    with EpisodeStore.open(tmp_path / "run", create=False) as store:
        finished = store.episodes(state="finished")
    ids = [row["episode_id"] for row in finished]
    record_fault(
        "the only env server SIGKILLed, never back (then resume)",
        injected=1,
        survived=int(len(set(ids)) == len(tasks) * GROUP_SIZE),
        lost=len(tasks) * GROUP_SIZE - len(set(ids)),
        trained_twice=len(ids) - len(set(ids)),
    )

    assert 1.0 <= waited_s < 10.0, f"stopped {waited_s:.2f} s after the kill"
    assert causes and all(isinstance(e, EnvServersUnavailable) for e in causes), causes
    assert message.startswith("no env server answered for 1 s (env.reconnect_timeout_s)"), message
    assert url in message and "agentrl serve-env agentrl/GuessNumber-v0" in message, message
    assert f"agentrl train --resume {tmp_path / 'run'}" in message, message
    assert stored_then["integrity"] == "ok", stored_then
    assert 2 <= len(tasks) - len(todo) < len(tasks), len(todo)
    assert len(resumed.groups) == len(todo) and all(g.complete for g in resumed.groups)
    assert end["integrity"] == "ok" and not end["lost"] and not end["trained_twice"], end
    assert len(ids) == len(set(ids)) == len(tasks) * GROUP_SIZE, (len(ids), len(set(ids)))

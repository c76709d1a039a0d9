"""Rollout worker processes (``rollout.workers > 1``): the same episodes, nothing lost.

Real worker processes, real SQLite, the real scheduler and rollout controller; the
engine is a scripted client in the main process (the worker <-> main seam is the one
under test; `agentrl rollout` with workers against real vLLM is in test_cli_rollout.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import pickle
import random
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import benchmarks.common  # noqa: F401  (registers bench/Echo-v0 here too)
from agentrl.errors import ConfigError, InfraError
from agentrl.inference.base import Generation, SamplingConfig
from agentrl.queue import TrajectoryQueue
from agentrl.rollout import EpisodeRunner, RolloutConfig, Scheduler, tasks_for
from agentrl.rollout.controller import RolloutController
from agentrl.rollout.wire import PromptsReceived, PromptsSent
from agentrl.rollout.workers import WorkerRunner, open_runner
from agentrl.runtime.metrics import Metrics
from agentrl.store import EpisodeStore, StoreWriter, schema
from agentrl.store.schema import segment_columns
from agentrl.types import RequestId, Trajectory

IMPORTS = ["benchmarks.common"]  # registers bench/Echo-v0 (async, get_state/set_state)


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


class SlowClient:
    """Answers each request after ``delay_s`` with ``max_tokens`` tokens; an abort ends it
    at once with half of them (finish ``abort``). Records any request that arrives while
    ``gate`` (set after construction) is closed."""

    def __init__(self, tokenizer: Any, delay_s: float = 0.0) -> None:
        self.token = tokenizer.encode(" hello")[0]
        self.eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.delay_s = delay_s
        self.version = 0
        self.gate: asyncio.Event | None = None
        self.past_gate: list[str] = []
        self.calls = 0
        self.prompts: dict[str, list[list[int]]] = {}  # per episode, in order
        self._call_waiters: list[tuple[int, asyncio.Event]] = []
        self._aborts: dict[str, asyncio.Event] = {}
        self._results: dict[str, asyncio.Future[Generation]] = {}
        self.requests = self

    def ids(self) -> list[str]:
        return list(self._aborts)

    def __len__(self) -> int:
        return len(self._aborts)

    @property
    def max_model_len(self) -> int:
        return 4096

    async def generate(
        self, prompt: Sequence[int], sampling: SamplingConfig, request_id: str
    ) -> Generation:
        if self.gate is not None and not self.gate.is_set():
            self.past_gate.append(request_id)
        self.calls += 1
        self.prompts.setdefault(RequestId.parse(request_id).episode_id, []).append(list(prompt))
        for n, reached in self._call_waiters:
            if self.calls >= n:
                reached.set()
        abort = self._aborts[request_id] = asyncio.Event()
        done = self._results[request_id] = asyncio.get_running_loop().create_future()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(abort.wait(), self.delay_s)
            n = sampling.max_tokens
            if abort.is_set():
                ids: tuple[int, ...] = (self.token,) * max(1, n // 2)
                finish = "abort"
            else:
                ids, finish = (self.token,) * (n - 1) + (self.eot,), "stop"
            gen = Generation(request_id, ids, (-0.5,) * len(ids), finish, self.version, len(prompt))
            done.set_result(gen)
            return gen
        finally:
            self._aborts.pop(request_id, None)
            self._results.pop(request_id, None)

    async def wait_calls(self, n: int) -> None:
        """Until ``n`` requests have arrived."""
        reached = asyncio.Event()
        self._call_waiters.append((n, reached))
        await reached.wait()

    async def abort(self, request_id: str) -> Generation | None:
        abort, done = self._aborts.get(request_id), self._results.get(request_id)
        if abort is None or done is None:
            return None
        abort.set()
        return await done

    async def reload_weights(
        self, weights_dir: str, version: int | None = None, *, keep_inflight: bool = False
    ) -> int:
        await asyncio.sleep(0.01)
        self.version = self.version + 1 if version is None else version
        return self.version


async def _run(
    tokenizer: Any,
    client: Any,
    tmp: Path,
    workers: int,
    episodes: int,
    turns: int,
    *,
    concurrency: int | None = None,
    during: Any = None,
    resume: bool = False,
    imports: list[str] = IMPORTS,
) -> tuple[list[Trajectory], EpisodeStore, Any]:
    rollout = RolloutConfig(
        max_turns=turns,
        max_tokens_per_turn=8,
        ignore_eos=True,
        workers=workers,
        group_size=1,
        concurrency=concurrency or episodes,
    )
    store = EpisodeStore.open(tmp)
    queue = TrajectoryQueue(episodes + 1)
    async with StoreWriter(store) as writer, contextlib.AsyncExitStack() as stack:
        from agentrl.config import ModelConfig

        runner = await open_runner(
            stack,
            client,
            tokenizer,
            rollout,
            model=ModelConfig(),
            imports=imports,
            metrics=Metrics(),
            checkpoint=writer.partial,
        )
        scheduler = Scheduler(runner, queue, rollout, writer=writer, resume=resume)
        tasks = list(tasks_for("bench/Echo-v0", episodes, turns=turns))
        if during is None:
            await scheduler.run(tasks)
        else:
            async with asyncio.TaskGroup() as tg:
                run = tg.create_task(scheduler.run(tasks))
                await during(runner, writer, scheduler)
                await run
        await writer.flush()
    trajectories = [t for g in queue._groups for t in g.trajectories]
    return trajectories, store, runner


def _key(trajectories: list[Trajectory]) -> dict[str, Any]:
    return {
        t.episode_id: (
            t.token_ids.tolist(),
            t.loss_mask.tolist(),
            t.versions.tolist(),
            np.nan_to_num(t.logprobs, nan=9.0).tolist(),
            t.messages,
            t.turn_rewards,
            t.status,
        )
        for t in trajectories
    }


async def test_workers_give_the_same_episodes_as_one_process(
    tokenizer: Any, tmp_path: Path
) -> None:
    client1, client2 = SlowClient(tokenizer), SlowClient(tokenizer)
    one, store1, runner1 = await _run(tokenizer, client1, tmp_path / "one", 1, 24, 3)
    assert isinstance(runner1, EpisodeRunner)
    two, store2, runner2 = await _run(tokenizer, client2, tmp_path / "two", 2, 24, 3)
    assert isinstance(runner2, WorkerRunner)
    assert len(one) == len(two) == 24
    assert _key(one) == _key(two)  # token for token, logprob for logprob
    # the engine got the very prompts (sent as what each adds to the one before), and the
    # main process holds none of them once the episodes ended
    assert client2.prompts == client1.prompts
    assert {len(p) for p in client2.prompts.values()} == {3}
    assert len(runner2._prompts) == 0
    for store in (store1, store2):
        report = store.audit()
        assert report["ok"], report
        assert sum(1 for _ in store.all_trajectories()) == 24
    # the workers encode each ended episode's row for the store (the main process only
    # inserts it): the row is the one the main process would have encoded
    stored = {
        r[0]: tuple(r[1:])
        for r in store2._db.execute(
            "SELECT episode_id, min_version, max_version, num_tokens, num_sampled, token_ids, "
            "logprobs, versions, loss_mask, meta FROM trajectories"
        )
    }
    assert stored == {t.episode_id: segment_columns(t) for t in two}
    # `agentrl replay --verify` reads a workers' episode as it reads any other
    from agentrl.replay.episodes import load, verify

    for episode_id in sorted(_key(two))[:3]:
        recorded = load(store2, episode_id)
        result = await asyncio.to_thread(verify, recorded)  # a sync call, as the CLI makes it
        assert len(recorded.env_log) == 4 and result.difference is None, result
    store1.close()
    store2.close()
    # the workers' counts reach the main process's metrics
    m = runner2.metrics.counters
    assert m["episodes_started"] == 24 and m["episodes_finished"] == 24
    assert m["tokens_sampled"] == 24 * 3 * 8


def test_a_prompt_crosses_as_what_it_adds_to_the_episodes_last_one() -> None:
    """A worker sends a turn's prompt as the tail after the episode's previous prompt when
    it extends it, whole when it does not (a new template segment, a shorter prompt);
    the main process rebuilds each exactly, and refuses a tail whose base it lacks."""
    sent, received = PromptsSent(), PromptsReceived()
    rng = random.Random(0)
    first = [rng.randrange(50_000) for _ in range(5_000)]
    prompts = {
        "e": [
            first,
            first + [7] * 300,
            first + [7] * 300 + [8, 9],
            [1, 2, 3],
            [1, 2, 3, 4],
            [9] * 6,
            [1, 2],
            [1, 2],
        ],
        "f": [[5] * 10, [5] * 10 + [6]],
    }
    payloads = []
    n = 0
    for i in range(max(len(p) for p in prompts.values())):
        for episode_id, ps in prompts.items():  # the two episodes' requests interleave
            if i < len(ps):
                payload = sent.payload(episode_id, n, list(ps[i]))
                payloads.append(payload)
                wire = pickle.loads(pickle.dumps(payload))
                assert received.prompt((0, episode_id), n, wire) == ps[i]
                n += 1
    whole = [p for p in payloads if isinstance(p, list)]
    tails = [p for p in payloads if isinstance(p, tuple)]
    # e's first, its new starts [1, 2, 3] (shorter) and [9] * 6 (longer), the shorter
    # [1, 2]; f's first
    assert len(whole) == 5 and len(tails) == 5
    assert tails[0] == (0, 5_000, [7] * 300)  # 300 tokens cross, not 5,300
    assert len(pickle.dumps(tails[0])) < len(pickle.dumps(first)) / 20

    sent.forget("e")
    assert isinstance(sent.payload("e", n, [1, 2, 3]), list)  # a new attempt: whole
    assert len(sent) == 2
    # the main process never rebuilds from a base it does not hold
    received.forget((0, "f"))
    with pytest.raises(InfraError, match="does not hold"):
        received.prompt((0, "f"), n + 1, (3, 11, [1]))
    received.prompt((1, "f"), n + 1, [5] * 11)
    with pytest.raises(InfraError, match="request 50"):
        received.prompt((1, "f"), n + 2, (50, 11, [1]))  # not the last request's base


async def test_a_weight_update_pauses_and_resumes_episodes_in_the_workers(
    tokenizer: Any, tmp_path: Path
) -> None:
    client = SlowClient(tokenizer, delay_s=0.05)
    stats: list[Any] = []

    async def update(runner: WorkerRunner, writer: StoreWriter, _: Scheduler) -> None:
        controller = RolloutController(runner, writer=writer)
        client.gate = runner.admission
        await client.wait_calls(20)  # episodes are in flight in both workers
        # the live view (agentrl top) sees them as the workers report them
        live = list(runner.live.values())
        assert len(live) == 16 and {p.env_id for p in live} == {"bench/Echo-v0"}
        assert any(p.turn > 0 for p in live) and any(p.sampled > 0 for p in live)
        stats.append(await controller.update_weights(weights_dir="/nowhere"))

    trajectories, store, _ = await _run(tokenizer, client, tmp_path, 2, 16, 4, during=update)
    (s,) = stats
    assert s.version == 1 and s.requests_aborted > 0 and s.episodes_paused >= s.requests_aborted
    assert s.tokens_reprefilled > 0
    assert client.past_gate == []  # no request reached the engine during the update
    assert len(trajectories) == 16
    straddling = 0
    for t in trajectories:
        sampled = t.versions[t.loss_mask.astype(bool)].tolist()
        assert sampled == sorted(sampled)  # old tokens first, then the new version's
        assert int(t.loss_mask.sum()) == 4 * 8  # the aborted halves were kept, not resampled
        straddling += len(set(sampled)) == 2
    assert straddling >= s.requests_aborted  # the aborted turns continued under version 1
    assert store.audit()["ok"]
    assert [v["version"] for v in store.versions()] == [1]
    store.close()


async def test_a_request_that_crosses_the_closing_gate_is_held_until_it_opens(
    tokenizer: Any,
) -> None:
    """A worker may send a generation request just before it learns the gate closed; the
    main process holds it, so no request reaches the engine during a weight update."""
    import pickle

    client = SlowClient(tokenizer)
    rollout = RolloutConfig(workers=2, group_size=1, concurrency=1, max_tokens_per_turn=4)
    async with WorkerRunner(client, tokenizer, rollout, imports=IMPORTS) as runner:
        runner.admission.clear()  # a weight update begins
        worker = runner._workers[0]
        request = (
            "gen",
            10**6,
            [1, 2, 3],
            pickle.dumps(SamplingConfig(max_tokens=4)),
            RequestId("crossing/0", 0).format(),
            "crossing/0",
            0,
            0,
        )
        runner._handle(worker, request)  # as the worker's message would arrive
        await asyncio.sleep(0.2)
        assert client.calls == 0  # held in the main process, not sent to the engine
        runner.admission.set()
        await client.wait_calls(1)  # sent once the gate opened
        assert client.past_gate == []


async def test_drop_policy_reruns_stale_episodes_from_the_workers(
    tokenizer: Any, tmp_path: Path
) -> None:
    client = SlowClient(tokenizer, delay_s=0.05)
    stats: list[Any] = []

    async def update(runner: WorkerRunner, writer: StoreWriter, _: Scheduler) -> None:
        controller = RolloutController(runner, writer=writer, policy="drop", max_staleness=0)
        await client.wait_calls(20)
        stats.append(await controller.update_weights(weights_dir="/nowhere"))

    trajectories, store, runner = await _run(tokenizer, client, tmp_path, 2, 16, 4, during=update)
    (s,) = stats
    assert s.episodes_dropped > 0 and s.tokens_discarded > 0
    assert runner.metrics.counters["episodes_dropped"] == s.episodes_dropped
    assert len(trajectories) == 16
    for t in trajectories:  # a dropped episode ran again, all of it under version 1
        sampled = t.versions[t.loss_mask.astype(bool)].tolist()
        assert int(t.loss_mask.sum()) == 4 * 8
        if t.attempt > 0:
            assert set(sampled) == {1}
    assert sum(t.attempt > 0 for t in trajectories) == s.episodes_dropped
    assert store.audit()["ok"]
    store.close()


async def test_a_dead_worker_stops_the_run_and_resume_finishes_it(
    tokenizer: Any, tmp_path: Path
) -> None:
    client = SlowClient(tokenizer, delay_s=0.02)

    async def kill(runner: WorkerRunner, _w: StoreWriter, _s: Scheduler) -> None:
        await client.wait_calls(40)
        worker = next(w for w in runner._workers if w.index == 0)  # start order may differ
        os.kill(worker.process.pid, signal.SIGKILL)

    with pytest.raises(BaseExceptionGroup) as caught:
        await _run(tokenizer, client, tmp_path, 2, 32, 4, concurrency=16, during=kill)
    errors = [e for e in _leaves(caught.value) if isinstance(e, InfraError)]
    assert errors and "rollout worker 0" in str(errors[0]) and "died" in str(errors[0])
    store = EpisodeStore.open(tmp_path)
    paused = [r["episode_id"] for r in store.episodes() if r["state"] == "paused"]
    assert paused and all(store.partial(e) is not None for e in paused)  # checkpointed
    store.close()
    # --resume: the checkpointed episodes continue, the rest run; all 32 end once
    _, store, runner = await _run(tokenizer, SlowClient(tokenizer), tmp_path, 2, 32, 4, resume=True)
    assert runner.metrics.counters["episodes_resumed"] == len(paused)  # from their prefixes
    ended = {t.episode_id for t in store.all_trajectories()}
    assert len(ended) == 32
    report = store.audit()
    assert report["ok"], report
    store.close()


def _leaves(e: BaseException) -> list[BaseException]:
    if isinstance(e, BaseExceptionGroup):
        return [x for sub in e.exceptions for x in _leaves(sub)]
    return [e]


async def test_workers_refuse_what_they_cannot_run(tokenizer: Any, tmp_path: Path) -> None:
    from agentrl.config import ModelConfig

    rollout = RolloutConfig(workers=2, group_size=1, concurrency=1)
    client = SlowClient(tokenizer)
    async with contextlib.AsyncExitStack() as stack:
        with pytest.raises(ConfigError, match="serve the envs"):
            await open_runner(
                stack,
                client,
                tokenizer,
                rollout,
                model=ModelConfig(),
                imports=(),
                make=lambda *a, **k: None,
            )

    with pytest.raises(ConfigError, match=r"rollout\.workers"):
        RolloutConfig(workers=0)
    with pytest.raises(BaseExceptionGroup) as caught:  # an env the workers do not know
        await _run(tokenizer, client, tmp_path, 2, 2, 1, imports=[])
    for error in _leaves(caught.value):
        assert isinstance(error, InfraError) and "env.imports" in str(error), error
    with pytest.raises(InfraError, match="exited with code"):  # an env module that fails
        async with WorkerRunner(
            client, tokenizer, dataclasses.replace(rollout), imports=["agentrl_no_such_module"]
        ):
            pass


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
async def test_workers_run_their_episodes_on_the_event_loop_the_config_names(
    tokenizer: Any, event_loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rollout = RolloutConfig(
        max_turns=2,
        max_tokens_per_turn=8,
        ignore_eos=True,
        workers=2,
        group_size=1,
        concurrency=4,
        worker_event_loop=event_loop,
    )
    async with WorkerRunner(SlowClient(tokenizer), tokenizer, rollout, imports=IMPORTS) as runner:
        loops = runner.event_loops
        tasks = list(tasks_for("bench/Echo-v0", 4, turns=2))
        results = await asyncio.gather(*(runner.run(t, f"{t.task_id}/0") for t in tasks))
    assert len(loops) == 2 and all(loop.startswith(f"{event_loop}.") for loop in loops), loops
    for (trajectory,) in results:
        assert len(trajectory.turn_rewards) == 2 and int(trajectory.loss_mask.sum()) == 16
        # no store here (no checkpoint callback): the rows the workers sent are not kept
        assert trajectory not in schema._ENCODED

    if event_loop == "uvloop":  # asked for, not installed: refused before anything starts
        import importlib.util

        find_spec = importlib.util.find_spec

        def without_uvloop(name: str, *args: Any) -> Any:
            return None if name == "uvloop" else find_spec(name, *args)

        monkeypatch.setattr(importlib.util, "find_spec", without_uvloop)
        with pytest.raises(ConfigError, match=r"worker_event_loop = 'asyncio'"):
            await WorkerRunner(SlowClient(tokenizer), tokenizer, rollout, imports=IMPORTS).start()
    with pytest.raises(ConfigError, match="worker_event_loop = 'trio'"):
        RolloutConfig(worker_event_loop="trio")  # type: ignore[arg-type]

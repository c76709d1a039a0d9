"""The episode loop, the scheduler and the queue, against a scripted client (fast).

The same loop against real vLLM is tested in test_vllm_rollout.py.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from agentrl.env import TextEnv, register_env
from agentrl.queue import QueueClosed, TrajectoryQueue
from agentrl.rollout import EpisodeRunner, RolloutConfig, Scheduler, tasks_for
from agentrl.runtime.metrics import LoopLagMonitor, Metrics
from agentrl.types import Group, Task
from tests.rollout.fakes import ScriptedClient


async def slow_tool(seconds: float) -> str:
    """Sleep, then say so.

    Args:
        seconds: How long to sleep.
    """
    await asyncio.sleep(seconds)
    return "slept"


class FlakyEnv(TextEnv):
    """Multi-turn; its step raises on about 20 % of calls (seeded per episode)."""

    tools = (slow_tool,)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.turns = 0
        return "Talk to me.", {}

    def step(self, action: str):
        if self.np_random.random() < 0.2:
            raise RuntimeError("the flaky env broke")
        self.turns += 1
        return "More.", 0.5, self.turns >= 3, False, {}


register_env("tests/Flaky-v0", FlakyEnv)


def _faulty_model(prompt: Any) -> str:
    """Every third reply is a malformed tool call, every fifth calls a slow tool."""
    n = next(_replies)
    if n % 3 == 0:
        return '<tool_call>{"name": "slow_tool", "arguments": {broken</tool_call>'
    if n % 5 == 0:
        return '<tool_call>{"name": "slow_tool", "arguments": {"seconds": 5}}</tool_call>'
    return "ok"


_replies = itertools.count()


async def test_faults_are_recorded_and_nothing_is_lost(tokenizer) -> None:
    client = ScriptedClient(tokenizer, _faulty_model)
    config = RolloutConfig(max_turns=6, tool_timeout_s=0.05, max_tool_calls=4)
    runner = EpisodeRunner(client, tokenizer, config)
    queue = TrajectoryQueue(100)
    scheduler = Scheduler(runner, queue, RolloutConfig(concurrency=32, group_size=4, max_retries=1))
    async with LoopLagMonitor(runner.metrics):
        await scheduler.run(tasks_for("tests/Flaky-v0", 25))
    groups = [await queue.get() for _ in range(len(queue))]
    assert len(groups) == 25 and all(g.complete for g in groups)
    final = [t for g in groups for t in g.trajectories]
    attempts = final + scheduler.failed_attempts
    m = runner.metrics.counters
    # Every attempt is accounted for: started = finished + truncated + failed.
    assert m["episodes_started"] == len(attempts) == 100 + m["episode_retries"]
    assert m["episodes_started"] == (
        m["episodes_finished"] + m["episodes_truncated"] + m["episodes_failed"]
    )
    failed = [t for t in attempts if t.status == "failed"]
    assert failed and all("the flaky env broke" in t.reason for t in failed)
    assert len(scheduler.failed_attempts) == m["episode_retries"] > 0
    assert m["tool_errors/malformed_json"] > 0 and m["tool_errors/timeout"] > 0
    assert all(t.reason for t in final)
    tool_spans = [t for t in final if any(s.kind == "tool" for s in t.spans)]
    assert any("took longer than 0.05 s" in str(t.messages) for t in tool_spans)
    assert not client.in_flight and not runner.live
    assert "loop_lag_s/p99" in runner.metrics.snapshot()


async def test_sampled_tokens_and_logprobs_are_exactly_what_the_client_returned(
    tokenizer,
) -> None:
    client = ScriptedClient(tokenizer, lambda p: "Guess: 50")
    runner = EpisodeRunner(client, tokenizer, RolloutConfig(max_turns=4))
    (traj,) = await runner.run(Task("t", "agentrl/GuessNumber-v0", 3), "e0")
    sampled = [s for s in traj.spans if s.kind == "assistant"]
    assert len(sampled) == len(client.calls) == len(traj.turn_rewards)
    for span, (prompt, gen) in zip(sampled, client.calls, strict=True):
        assert traj.token_ids[: span.start].tolist() == prompt  # the exact prompt sent
        assert traj.span_tokens(span) == list(gen.token_ids)
        assert traj.logprobs[span.start : span.end].tolist() == list(gen.logprobs)
    assert traj.status in ("finished", "truncated") and traj.reason


async def test_context_window_ends_the_episode_as_truncated(tokenizer) -> None:
    client = ScriptedClient(tokenizer, lambda p: "Guess: 1 " * 30, max_model_len=160)
    runner = EpisodeRunner(client, tokenizer, RolloutConfig(max_turns=8, max_tokens_per_turn=64))
    (traj,) = await runner.run(Task("t", "agentrl/GuessNumber-v0", 0), "e0")
    assert traj.status == "truncated" and "context" in traj.reason and len(traj) <= 160


async def test_admission_bounds_staleness_and_the_queue_bound_holds(tokenizer) -> None:
    client = ScriptedClient(tokenizer, lambda p: "Guess: 50")
    runner = EpisodeRunner(client, tokenizer, RolloutConfig(max_turns=2))
    queue = TrajectoryQueue(3)
    config = RolloutConfig(concurrency=64, group_size=2, max_staleness=1)
    scheduler = Scheduler(runner, queue, config, batch_size=4)
    worst = 0

    async def trainer() -> None:
        nonlocal worst
        for _ in range(10):  # 10 steps of 2 groups (4 trajectories) each
            batch = await queue.get_batch(2)
            assert all(isinstance(g, Group) and g.complete for g in batch)
            worst = max(worst, scheduler.started - 4 * client.version)
            await asyncio.sleep(0.01)
            client.version += 1
            await scheduler.notify_version()
        scheduler.stop()
        await scheduler.notify_version()

    async with asyncio.TaskGroup() as tg:
        tg.create_task(trainer())
        tg.create_task(scheduler.run(tasks_for("agentrl/GuessNumber-v0", None)))
        while not scheduler._stopping:
            assert len(queue) <= 3
            await asyncio.sleep(0)
    assert queue.high_water <= 3
    assert 0 < worst <= (1 + 1) * 4  # (max_staleness + 1) * batch_size


async def test_cancelling_mid_run_leaves_no_tasks_or_requests(tokenizer) -> None:
    client = ScriptedClient(tokenizer, lambda p: "Guess: 50")
    runner = EpisodeRunner(client, tokenizer)
    scheduler = Scheduler(
        runner, TrajectoryQueue(1000), RolloutConfig(concurrency=50, group_size=4)
    )
    before = asyncio.all_tasks()
    run = asyncio.create_task(scheduler.run(tasks_for("agentrl/GuessNumber-v0", None)))
    while runner.metrics.counters["tokens_sampled"] < 500:  # noqa: ASYNC110
        await asyncio.sleep(0.005)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert asyncio.all_tasks() == before
    assert not client.in_flight and not runner.live


async def test_queue_rejects_incomplete_groups_and_closes() -> None:
    queue = TrajectoryQueue(2)
    with pytest.raises(ValueError, match="only complete groups"):
        await queue.put(Group(Task("t", "e", 0), size=2))
    await queue.close()
    with pytest.raises(QueueClosed):
        await queue.get()


def test_metrics_snapshot_has_percentiles() -> None:
    m = Metrics()
    for i in range(100):
        m.observe("x", i)
    m.count("n", 2)
    snap = m.snapshot()
    assert snap["n"] == 2 and snap["x/max"] == 99 and 97 <= snap["x/p99"] <= 99


async def test_an_engine_failure_stops_the_run_with_an_infra_error(tokenizer) -> None:
    from agentrl.errors import InfraError

    client = ScriptedClient(tokenizer, lambda p: "Guess: 50")

    async def dead(*args: Any) -> Any:
        raise ConnectionError("engine process died")

    client.generate = dead  # type: ignore[method-assign]
    runner = EpisodeRunner(client, tokenizer)
    scheduler = Scheduler(runner, TrajectoryQueue(10), RolloutConfig(concurrency=4, group_size=4))
    with pytest.raises(ExceptionGroup) as info:
        await scheduler.run(tasks_for("agentrl/GuessNumber-v0", 3))
    infra, rest = info.value.split(InfraError)
    assert infra is not None and rest is None  # the run's and the group's task groups
    errors = leaves(info.value)
    assert "engine process died" in str(errors[0]) and "the run stops" in str(errors[0])


def leaves(error: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, in order."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for e in error.exceptions for leaf in leaves(e)]
    return [error]


async def test_restored_groups_beyond_the_bound_are_queued_and_new_puts_wait() -> None:
    """A run killed repeatedly can leave more untrained groups than the queue holds."""
    from tests.trainer.test_checkpoint import synthetic_groups

    queue = TrajectoryQueue(2)
    restored = synthetic_groups(0, groups=5, size=2)
    await asyncio.wait_for(queue.put_restored(restored), 1.0)  # no room needed
    assert len(queue) == 5 and queue.high_water == 5
    late = asyncio.create_task(queue.put(synthetic_groups(1, groups=1, size=2)[0]))
    await asyncio.sleep(0.05)
    assert not late.done(), "a new group waits until the restored ones drain below the bound"
    got = await queue.get_batch(4)
    assert [g.task.task_id for g in got] == [g.task.task_id for g in restored[:4]]
    await asyncio.wait_for(late, 1.0)
    assert len(queue) == 2


async def test_an_episode_resumed_from_its_gate_checkpoint_records_each_turn_once(
    tokenizer,
) -> None:
    """A checkpoint taken while the episode waits at the admission gate (a weight
    update) holds the start of the turn it is about to sample; resumed from it, the
    episode must not record that turn's start a second time (replay and forks find a
    turn by its start)."""
    client = ScriptedClient(tokenizer, lambda p: "Guess: 50")
    gate = asyncio.Event()
    gate.set()
    generate = client.generate

    async def closing_the_gate(*args: Any) -> Any:
        gate.clear()  # an update starts during the first generation: turn 2 waits
        return await generate(*args)

    client.generate = closing_the_gate  # type: ignore[method-assign]
    config = RolloutConfig(max_turns=3)
    runner = EpisodeRunner(client, tokenizer, config, admission=gate)
    task = Task("t", "agentrl/GuessNumber-v0", 3)
    episode = asyncio.create_task(runner.run(task, "e0"))
    await asyncio.wait_for(runner.wait_parked({"e0"}), 30)
    assert runner.parked == ("e0",)
    at_gate = runner.snapshot("e0")
    assert at_gate.turn == 1 and at_gate.turn_sampled == 0 and len(at_gate.turn_starts) == 2
    client.generate = generate  # type: ignore[method-assign]
    gate.set()
    (uninterrupted,) = await episode
    (resumed,) = await EpisodeRunner(client, tokenizer, config).resume(at_gate)
    assert len(uninterrupted.turn_starts) == len(uninterrupted.turn_rewards) == 3
    assert resumed.turn_starts == uninterrupted.turn_starts
    assert resumed.token_ids.tolist() == uninterrupted.token_ids.tolist()


async def test_each_turns_checkpoint_holds_the_episode_as_it_was_at_the_boundary(
    tokenizer,
) -> None:
    """With ``checkpoint_interval_s = 0`` every turn boundary the episode goes on from is
    checkpointed (not the last, after which it ends at the turn limit: its end supersedes
    a checkpoint there), and each checkpoint holds the episode exactly as it was there
    (tokens, messages, turn starts, env log, nothing of the next turn): resumed from the
    first, the episode ends as the uninterrupted one did."""
    client = ScriptedClient(tokenizer, lambda p: "Guess: 50")
    snapshots: list[Any] = []
    config = RolloutConfig(max_turns=4, checkpoint_interval_s=0)
    runner = EpisodeRunner(client, tokenizer, config, checkpoint=snapshots.append)
    (uninterrupted,) = await runner.run(Task("t", "agentrl/GuessNumber-v0", 3), "e0")
    turns = len(uninterrupted.turn_rewards)
    assert uninterrupted.reason == "turn limit (4) reached"
    assert turns == 4 and len(snapshots) == turns - 1, "a checkpoint at each boundary but the last"
    tokens = uninterrupted.token_ids.tolist()
    for turn, snap in enumerate(snapshots, start=1):
        (segment,) = snap.segments
        assert snap.turn == turn and snap.turn_sampled == 0 and snap.version == 0
        assert segment.token_ids.tolist() == tokens[: len(segment.token_ids)]
        assert snap.turn_starts == uninterrupted.turn_starts[:turn]
        assert snap.messages == uninterrupted.messages[: len(snap.messages)]
        assert snap.rewards == uninterrupted.turn_rewards[:turn]
        assert len(snap.env_log) == turn + 1  # the reset, then one step a turn
    (resumed,) = await EpisodeRunner(client, tokenizer, config).resume(snapshots[0])
    assert resumed.token_ids.tolist() == tokens
    assert resumed.turn_starts == uninterrupted.turn_starts

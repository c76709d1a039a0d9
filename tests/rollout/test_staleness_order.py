"""No group is trained more than ``max_staleness`` versions after its admission, even
when groups end out of admission order (a slow episode, a retry, a paused one).

Admission alone caps how many episodes are out at once; the trainer taking the oldest
*ended* groups then trained a slow group admitted at version 0 at version 2 with
``max_staleness = 1`` (fresh-clone CI: ``test_async_training_learns_and_is_on_policy``).
A step at version ``u`` now waits for every group admitted at ``u - max_staleness`` or
before and takes those first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from agentrl.inference.base import Generation, SamplingConfig
from agentrl.queue import TrajectoryQueue
from agentrl.rollout import EpisodeRunner, RolloutConfig, Scheduler, tasks_for
from agentrl.types import Group, Task
from tests.rollout.fakes import ScriptedClient

ENV = "agentrl/GuessNumber-v0"


def group(name: str, admitted_at: int | None) -> Group:
    return Group(Task(name, ENV, 0), 0, admitted_at=admitted_at)


async def test_a_step_waits_for_a_due_group_takes_it_first_even_into_a_full_queue() -> None:
    queue = TrajectoryQueue(2)
    for version in (0, 1, 1):
        queue.expect(version)
    await queue.put(group("b", 1))  # two groups admitted later end first
    await queue.put(group("c", 1))  # and fill the queue
    step = asyncio.create_task(queue.get_batch(2, due=0))
    await asyncio.sleep(0.01)
    assert not step.done(), "the step waits for the group admitted at version 0"
    await asyncio.wait_for(queue.put(group("a", 0)), 1)  # full, but it is due: let in
    batch = await asyncio.wait_for(step, 1)
    assert [g.task.task_id for g in batch] == ["a", "b"]
    assert [g.task.task_id for g in await queue.get_batch(1)] == ["c"]
    assert queue.expected_due(10) == 0


async def test_a_withdrawn_group_is_not_waited_for() -> None:
    queue = TrajectoryQueue(4)
    queue.expect(0)
    queue.expect(1)
    await queue.put(group("b", 1))
    await queue.put(group("restored", None))  # from the store after a restart: never due
    step = asyncio.create_task(queue.get_batch(2, due=0))
    await asyncio.sleep(0.01)
    assert not step.done()
    queue.withdraw(0)  # its run was cancelled
    batch = await asyncio.wait_for(step, 1)
    assert [g.task.task_id for g in batch] == ["restored", "b"], "admitted before a restart"


class SlowFirstEpisode(ScriptedClient):
    """The first task's first episode takes 0.3 s a turn (three steps); the rest 1 ms."""

    async def generate(
        self, prompt_token_ids: Sequence[int], sampling: SamplingConfig, request_id: str
    ) -> Generation:
        if f"{ENV.replace('/', '.')}#0/0" in request_id:
            await asyncio.sleep(0.3)
        return await super().generate(prompt_token_ids, sampling, request_id)


async def _train(tokenizer: Any, wait_for_due: bool) -> list[tuple[int, Group]]:
    """Six steps of two groups of two, max_staleness 1; (version trained at, group)."""
    client = SlowFirstEpisode(tokenizer, lambda p: "Guess: 50")
    runner = EpisodeRunner(client, tokenizer, RolloutConfig(max_turns=1))
    queue = TrajectoryQueue(4)
    config = RolloutConfig(concurrency=8, group_size=2, max_staleness=1)
    scheduler = Scheduler(runner, queue, config, batch_size=4)
    trained: list[tuple[int, Group]] = []

    async def trainer() -> None:
        for _ in range(6):
            due = client.version - 1 if wait_for_due else None
            batch = await asyncio.wait_for(queue.get_batch(2, due=due), 10)
            trained.extend((client.version, g) for g in batch)
            await asyncio.sleep(0.1)  # the optimizer step
            client.version += 1
            await scheduler.notify_version()
        scheduler.stop()
        await scheduler.notify_version()

    async with asyncio.TaskGroup() as tg:
        tg.create_task(trainer())
        tg.create_task(scheduler.run(tasks_for(ENV, None)))
    return trained


async def test_a_slow_group_is_trained_within_max_staleness_of_its_admission(tokenizer) -> None:
    # The scenario is real: taking the oldest ended groups trains the slow one late.
    plain = await _train(tokenizer, wait_for_due=False)
    late = [(v, g) for v, g in plain if g.admitted_at is not None and v - g.admitted_at > 1]
    assert late and late[0][1].task.task_id.endswith("#0"), "the slow group went late"

    trained = await _train(tokenizer, wait_for_due=True)
    assert len(trained) == 12
    assert any(g.task.task_id.endswith("#0") for _, g in trained), "the slow one was trained"
    for version, g in trained:
        assert g.admitted_at is not None and version - g.admitted_at <= 1, (version, g.task)
        assert version - g.min_version() <= 1, "no token more than max_staleness old"

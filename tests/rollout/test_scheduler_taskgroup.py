"""A group's episodes share one TaskGroup: an InfraError in one cancels its siblings.

Against the scripted client (fast). Episode-level failures stay data and cancel
nothing; that is tested in test_runner.py and tests/faults/test_episode_faults.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from agentrl.errors import EngineError, InfraError
from agentrl.inference.base import Generation, SamplingConfig
from agentrl.queue import TrajectoryQueue
from agentrl.rollout import EpisodeRunner, RolloutConfig, Scheduler, tasks_for
from agentrl.types import RequestId
from tests.rollout.fakes import ScriptedClient

GROUP_SIZE = 4


class DyingClient(ScriptedClient):
    """Episode ``.../0`` fails with an EngineError once its siblings are all inside
    ``generate``, where they wait on an event nobody sets (until cancelled)."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer, lambda prompt: "Guess: 50")
        self.siblings_waiting = asyncio.Event()
        self.waiting: set[str] = set()
        self.cancelled: set[str] = set()

    async def generate(
        self, prompt_token_ids: Sequence[int], sampling: SamplingConfig, request_id: str
    ) -> Generation:
        episode_id = RequestId.parse(request_id).episode_id
        if episode_id.endswith("/0"):
            await self.siblings_waiting.wait()
            raise EngineError("the engine died in the middle of a group")
        self.in_flight.add(request_id)
        self.waiting.add(episode_id)
        if len(self.waiting) == GROUP_SIZE - 1:
            self.siblings_waiting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.add(episode_id)
            raise
        finally:
            self.in_flight.discard(request_id)
        raise AssertionError("unreachable: the event is never set")


def leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for e in error.exceptions for leaf in leaves(e)]
    return [error]


@pytest.mark.timeout(60)
async def test_an_infra_error_in_one_episode_cancels_its_siblings_and_stops_the_run(
    tokenizer: Any,
) -> None:
    client = DyingClient(tokenizer)
    runner = EpisodeRunner(client, tokenizer, RolloutConfig(max_turns=2))
    queue = TrajectoryQueue(10)
    config = RolloutConfig(concurrency=GROUP_SIZE, group_size=GROUP_SIZE)
    scheduler = Scheduler(runner, queue, config)
    (task,) = tasks_for("agentrl/GuessNumber-v0", 1)
    before = asyncio.all_tasks()

    with pytest.raises(ExceptionGroup) as info:
        await asyncio.wait_for(scheduler.run([task]), timeout=30)

    infra, rest = info.value.split(InfraError)
    assert infra is not None and rest is None, info.value
    assert [str(e) for e in leaves(info.value)] == ["the engine died in the middle of a group"]
    siblings = {f"{task.task_id}/{i}" for i in range(1, GROUP_SIZE)}
    assert client.waiting == siblings
    assert client.cancelled == siblings, "every sibling saw CancelledError"
    assert asyncio.all_tasks() == before, "no episode task is left running"
    assert not runner.live and not runner.parked and not client.in_flight
    assert scheduler.in_flight == 0 and scheduler.groups_done == 0 and len(queue) == 0
    counters = runner.metrics.counters
    assert counters["episodes_started"] == GROUP_SIZE
    assert not any(k.startswith("episodes_") and k != "episodes_started" for k in counters)

"""The turnstile: a burst of episodes goes on a slice per event-loop pass, in order."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentrl.env import TextEnv, register_env
from agentrl.rollout import EpisodeRunner, RolloutConfig
from agentrl.rollout.turnstile import Turnstile
from agentrl.types import Task
from tests.rollout.fakes import ScriptedClient


async def test_a_burst_goes_through_a_slice_per_loop_pass_in_arrival_order() -> None:
    loop = asyncio.get_running_loop()
    passes = 0

    def tick() -> None:  # one call per loop pass: counts the passes
        nonlocal passes
        passes += 1
        loop.call_soon(tick)

    loop.call_soon(tick)
    await asyncio.sleep(0)
    gate = Turnstile(per_pass=10)
    went: list[tuple[int, int]] = []  # (caller, pass it went on in)

    async def caller(i: int) -> None:
        await gate.through()
        went.append((i, passes))

    start = passes
    async with asyncio.TaskGroup() as tg:
        for i in range(95):
            tg.create_task(caller(i))
    assert [i for i, _ in went] == list(range(95))  # arrival order kept
    per_pass: dict[int, int] = {}
    for _, p in went:
        per_pass[p] = per_pass.get(p, 0) + 1
    assert max(per_pass.values()) <= 10  # never more than a slice in one pass
    assert len(per_pass) >= 10  # 95 callers took at least ten passes
    assert max(per_pass) - start < 40  # and not many more: a pass does a slice each
    assert gate.waiting == 0
    # a lone caller later on is not held at all
    before = passes
    await gate.through()
    assert passes == before


async def test_a_cancelled_waiter_gives_its_place_up() -> None:
    gate = Turnstile(per_pass=1)
    tasks = [asyncio.create_task(gate.through()) for _ in range(3)]
    await asyncio.sleep(0)  # all three arrive in one pass: the first goes on
    assert tasks[0].done() and gate.waiting == 2
    tasks[1].cancel()
    await asyncio.wait_for(tasks[2], 1)  # the cancelled one's turn goes to the next
    with pytest.raises(asyncio.CancelledError):
        await tasks[1]
    assert gate.waiting == 0


def test_per_pass_must_be_positive() -> None:
    with pytest.raises(ValueError, match="per_pass must be at least 1"):
        Turnstile(per_pass=0)


class _OneTurn(TextEnv):
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        return "Say something.", {}

    def step(self, action: str):
        return "", 1.0, True, False, {}


register_env("tests/OneTurn-v0", _OneTurn)


async def test_no_request_reaches_the_engine_while_the_gate_is_closed(tokenizer: Any) -> None:
    """Hundreds of parked episodes released at once go through the turnstile in slices;
    the gate closing again meanwhile holds back every one not yet sent (a wait between
    the gate's check and the request would let them through)."""
    gate = asyncio.Event()
    sent_while: list[bool] = []

    class Recording(ScriptedClient):
        async def generate(self, prompt_token_ids: Any, sampling: Any, request_id: str) -> Any:
            sent_while.append(gate.is_set())
            return await super().generate(prompt_token_ids, sampling, request_id)

    client = Recording(tokenizer, lambda ids: "hello")
    runner = EpisodeRunner(client, tokenizer, RolloutConfig(max_turns=1), admission=gate)
    n = 200
    tasks = [
        asyncio.create_task(runner.run(Task(f"t{i}", "tests/OneTurn-v0", i), f"ep{i}"))
        for i in range(n)
    ]
    await asyncio.sleep(0)  # every episode has started (it is live)
    async with asyncio.timeout(60):
        await runner.wait_parked({f"ep{i}" for i in range(n)})  # all at the closed gate
    assert len(runner.parked) == n and not sent_while
    gate.set()  # all wake in one pass ...
    await asyncio.sleep(0)
    gate.clear()  # ... and the gate closes again right after
    await asyncio.sleep(0.2)
    assert sent_while and all(sent_while), "a request was sent while the gate was closed"
    gate.set()
    async with asyncio.timeout(60):
        results = await asyncio.gather(*tasks)
    assert all(t[0].status == "finished" for t in results)
    assert all(sent_while) and len(sent_while) == n

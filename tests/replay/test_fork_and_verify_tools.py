"""Forks and verification are exact for envs whose tools change the env's state.

The policy is scripted (deterministic, as greedy sampling under unchanged weights is);
the real-vLLM replay paths are in test_replay_matrix.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from agentrl import replay
from agentrl.config import RolloutConfig
from agentrl.rollout import EpisodeRunner
from agentrl.types import Task
from tests.replay import ledger_env  # noqa: F401  (registers user/Ledger*)
from tests.rollout.fakes import ScriptedClient

CALL = '<tool_call>{"name": "transfer", "arguments": {"amount": 30}}</tool_call>'


def policy(tokenizer: Any) -> Any:
    """Transfer twice, then answer with the balance the last tool result names."""

    def reply(prompt_ids: Any) -> str:
        text = tokenizer.decode(prompt_ids)
        if text.count("transferred 30") < 2:
            return CALL
        return f"Answer: {text.rsplit('balance ', 1)[1].split()[0].rstrip('<|')}"

    return reply


@pytest.mark.timeout(120)
@pytest.mark.parametrize("env_id", ["user/Ledger-v0", "user/LedgerNoState-v0"])
async def test_fork_at_every_turn_reproduces_the_episode_and_verify_matches(
    tokenizer: Any, env_id: str
) -> None:
    client = ScriptedClient(tokenizer, policy(tokenizer))
    runner = EpisodeRunner(client, tokenizer, RolloutConfig(max_turns=6, max_tokens_per_turn=48))
    (recorded_traj,) = await runner.run(Task("t0", env_id, seed=3), "ep-0")
    assert recorded_traj.reward == 1.0, recorded_traj.reason  # the transfers reached the env
    tools = [e for e in recorded_traj.env_log if "tool" in e]
    assert len(tools) == 2 and all(e["result"].startswith("transferred") for e in tools)
    assert ("state" in tools[0]) == (env_id == "user/Ledger-v0")
    recorded = replay.Recorded("ep-0", 0, "finished", [recorded_traj], None)

    assert replay.verify(recorded).difference is None  # tool calls replayed too

    assert len(recorded.turn_starts) == 3  # two tool turns, then the answer
    for turn in range(len(recorded.turn_starts)):
        point = replay.fork_point(recorded, turn)
        note = replay.restore_note(point)
        if env_id == "user/Ledger-v0":
            assert point.env_state is not None and "exact)" in note
        else:
            assert point.env_state is None and (turn == 0 or "exact only if" in note)
        (fork,) = await runner.resume(dataclasses.replace(point, episode_id=f"f{turn}", attempt=0))
        assert fork.reward == 1.0, (turn, fork.reason, note)  # before: 0 from turn 1 on
        assert fork.token_ids.tolist() == recorded_traj.token_ids.tolist(), turn


async def test_verify_names_the_tool_call_that_now_differs(tokenizer: Any) -> None:
    client = ScriptedClient(tokenizer, policy(tokenizer))
    runner = EpisodeRunner(client, tokenizer, RolloutConfig(max_turns=6, max_tokens_per_turn=48))
    (traj,) = await runner.run(Task("t0", "user/Ledger-v0", seed=3), "ep-0")
    first_tool = next(i for i, e in enumerate(traj.env_log) if "tool" in e)
    traj.env_log[first_tool]["result"] = "transferred 31; balance 0"
    result = replay.verify(replay.Recorded("ep-0", 0, "finished", [traj], None))
    assert result.difference is not None and "tool call transfer" in result.difference
    assert result.steps == first_tool
    await asyncio.sleep(0)


async def test_a_rollout_reports_episodes_that_do_not_replay_from_their_seed(
    tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from agentrl.queue import TrajectoryQueue
    from agentrl.rollout import Scheduler, tasks_for

    client = ScriptedClient(tokenizer, lambda ids: "roll")
    config = RolloutConfig(max_turns=5, max_tokens_per_turn=8, group_size=4, concurrency=8)
    runner = EpisodeRunner(client, tokenizer, config)
    queue = TrajectoryQueue(100)
    with caplog.at_level("WARNING", logger="agentrl.rollout.runner"):
        await Scheduler(runner, queue, config).run(tasks_for("user/Dice-v0", 4))
    flagged = [
        t
        for _ in range(len(queue))
        for t in (await queue.get()).trajectories
        if "not_replayable" in t.info
    ]
    assert flagged and runner.metrics.counters["episodes_not_replayable"] == len(flagged)
    warnings = [r for r in caplog.records if "does not replay from its seed" in r.getMessage()]
    assert len(warnings) == 1 and "user/Dice-v0" in warnings[0].getMessage()  # once per env

    ledger = EpisodeRunner(ScriptedClient(tokenizer, policy(tokenizer)), tokenizer, config)
    (good,) = await ledger.run(Task("t1", "user/Ledger-v0", seed=1), "ep-1")
    assert "not_replayable" not in good.info  # a deterministic env is not flagged

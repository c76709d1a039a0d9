"""A run directory for the export tests, recorded by the real rollout loop.

The real :class:`EpisodeRunner` and :class:`Scheduler` run the shipped Calculator env
(a tool call, its result, then an answer) against a scripted client (no vLLM) with two
policy versions; the episodes go into a real SQLite store through its own API, with
what a long run also holds: a failed attempt that was retried, a fork made by
``agentrl replay`` and an unfinished (checkpointed) episode.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import envs  # noqa: F401  (registers agentrl/Calculator-v0)
from agentrl import replay
from agentrl.queue import TrajectoryQueue
from agentrl.rollout import EpisodeRunner, RolloutConfig, Scheduler, tasks_for
from agentrl.store import EpisodeStore
from agentrl.types import FailureKind, Trajectory
from tests.rollout.fakes import ScriptedClient

ENV = "agentrl/Calculator-v0"
CONFIG = {"run": {"name": "calc-demo"}, "model": {"path": "tiny"}, "env": {"id": ENV}}


def _model(tokenizer: Any, client: ScriptedClient) -> Any:
    def reply(prompt_ids: Sequence[int]) -> str:
        text = tokenizer.decode(list(prompt_ids))
        client.version = text.count("<|im_start|>assistant") - 1  # a new version each turn
        if "<tool_response>" in text:
            value = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text)[-1]
            return f"Answer: {value}"
        a, op, b = re.search(r"What is (\d+) (.) (\d+)\?", text).groups()
        call = {"name": "calculator", "arguments": {"expression": f"{a}{op}{b}"}}
        return f"<tool_call>{json.dumps(call)}</tool_call>"

    return reply


async def record_run(tokenizer: Any, out: Path, tasks: int = 3) -> Path:
    """Record ``tasks`` x 2 episodes (plus a retry, a fork, a checkpoint) in ``out``."""
    client = ScriptedClient(tokenizer, lambda p: "", max_model_len=2048)
    client.reply = _model(tokenizer, client)
    config = RolloutConfig(max_turns=3, max_tokens_per_turn=64, group_size=2)
    runner = EpisodeRunner(client, tokenizer, config)
    queue = TrajectoryQueue(100)
    scheduler = Scheduler(runner, queue, dataclasses.replace(config, concurrency=4))
    await scheduler.run(tasks_for(ENV, tasks))
    groups = [await queue.get() for _ in range(len(queue))]
    with EpisodeStore.open(out) as store:
        store.begin_run("rollout", CONFIG)
        store.add_tasks([g.task for g in groups], 2)
        store.episodes_started(
            [(t.episode_id, g.task, 0, 0) for g in groups for t in g.trajectories]
        )
        first = groups[0].trajectories[0]
        retried = dataclasses.replace(
            first, status="failed", reason="env_timeout: slow", failure=FailureKind.ENV_TIMEOUT
        )
        store.save_episode([retried], retried=True)
        store.episode_started(first.episode_id, groups[0].task, 1, 0)
        store.save_episodes(
            [
                ([dataclasses.replace(t, attempt=1 if t is first else 0)], False)
                for g in groups
                for t in g.trajectories
            ]
        )
        _fork_and_checkpoint(store, groups[1].trajectories[0])
    return out


def _fork_and_checkpoint(store: EpisodeStore, t: Trajectory) -> None:
    """A fork of ``t`` at turn 1 (ended, origin replay) and a checkpoint of it (unfinished)."""
    recorded = replay.load(store, t.episode_id)
    point = replay.fork_point(recorded, 1)
    fork_id = f"{t.episode_id}~fork@1-1"
    store.episode_started(fork_id, point.task, 0, 0)
    store.save_episode([dataclasses.replace(t, episode_id=fork_id)], origin="replay")
    parked = f"{t.episode_id}~resumed-1"
    store.episode_started(parked, point.task, 0, 0)
    store.save_partials([dataclasses.replace(point, episode_id=parked, version=1)])

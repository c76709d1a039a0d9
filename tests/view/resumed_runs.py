"""A run directory whose episodes resumed within one attempt, for the viewer's tests.

The episodes are played by the real :class:`~agentrl.rollout.EpisodeRunner` on
``agentrl/GuessNumber-v0`` with a scripted client (the engine is not what is tested
here) and stored with the store's API:

* ``t0/0``: played through at version 0, checkpointed at each turn boundary;
* ``t0/1``: resumed by the runner from ``t0/0``'s checkpoint at turn 2 under version 1,
  as ``--resume`` does after a crash (the runner records where, in ``info``);
* ``t0/2``: ``t0/0`` with the weights published in the middle of turn 1: the tokens
  from there on carry version 1, as an episode paused, checkpointed and resumed from
  its exact prefix does.

:class:`Resumed` says at which token each resumed. The run's config names the tiny
model and the rollout settings, so ``agentrl replay --fork-at`` can continue ``t0/0``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.config import RunConfig
from agentrl.rollout import EpisodeRunner, RolloutConfig
from agentrl.store import EpisodeStore
from agentrl.types import Task
from tests.rollout.fakes import ScriptedClient

ENV = "agentrl/GuessNumber-v0"
ROLLOUT = {"max_turns": 3, "max_tokens_per_turn": 16, "group_size": 3}


@dataclasses.dataclass(frozen=True)
class Resumed:
    run: Path
    checkpoint_token: int
    """``t0/1``: the first token after the checkpoint it resumed from."""
    checkpoint_turn: int
    publish_token: int
    """``t0/2``: the first token sampled under the new weights."""
    publish_turn: int


def build_resumed_run(root: Path, tokenizer: Any, model_path: str) -> Resumed:
    run = root / "resumed"
    task = Task("t0", ENV, 3)
    # in a thread of its own: a test module's browser may already run a loop in this one
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        whole, resumed, at = pool.submit(asyncio.run, _play(tokenizer, task)).result()
    published, token, turn = _published_mid_turn(whole, turn=1)
    config = RunConfig.from_dict({"model": {"path": model_path}, "rollout": ROLLOUT})
    with EpisodeStore.open(run) as store:
        store.begin_run("rollout", config.to_dict())
        store.add_tasks([task], 3)
        for t in (whole, resumed, published):
            store.episode_started(t.episode_id, task, 0, 0)
            store.save_episode([t])
    return Resumed(run, len(at.segments[0].token_ids), at.turn, token, turn)


async def _play(tokenizer: Any, task: Task) -> tuple[Any, Any, Any]:
    client = ScriptedClient(tokenizer, lambda prompt: "Guess: 50")
    snapshots: list[Any] = []
    config = RolloutConfig(**{**ROLLOUT, "checkpoint_interval_s": 0})
    runner = EpisodeRunner(client, tokenizer, config, checkpoint=snapshots.append)
    (whole,) = await runner.run(task, "t0/0")
    at = snapshots[1]
    assert at.turn == 2 and at.version == 0, (at.turn, at.version)
    client.version = 1  # the run came back with newer weights
    start = dataclasses.replace(at, episode_id="t0/1")
    (resumed,) = await EpisodeRunner(client, tokenizer, config).resume(start)
    return whole, resumed, at


def _published_mid_turn(whole: Any, turn: int) -> tuple[Any, int, int]:
    span = next(s for s in whole.spans if s.kind == "assistant" and s.turn == turn)
    token = span.start + (span.end - span.start) // 2
    versions = whole.versions.copy()
    later = np.arange(len(versions)) >= token
    versions[later & (versions >= 0)] = 1
    return dataclasses.replace(whole, episode_id="t0/2", versions=versions), token, turn

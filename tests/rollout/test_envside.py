"""The runner's record of where an episode resumed from a checkpoint (``info["resumed"]``).

``info`` itself is the env's latest (replaced at every step), so the resumes are kept
apart and written into every checkpoint and trajectory: a second crash keeps the first
resume's record, and a fork point (not a checkpoint, version -1) adds none.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from agentrl.rollout import EpisodeRunner, RolloutConfig
from agentrl.types import Task
from tests.rollout.fakes import ScriptedClient

pytestmark = pytest.mark.timeout(120)


async def test_each_checkpoint_resume_is_recorded_once_and_kept_across_crashes(
    tokenizer: Any,
) -> None:
    client = ScriptedClient(tokenizer, lambda prompt: "Guess: 50")
    config = RolloutConfig(max_turns=4, checkpoint_interval_s=0)
    first: list[Any] = []
    task = Task("t", "agentrl/GuessNumber-v0", 3)
    (whole,) = await EpisodeRunner(client, tokenizer, config, checkpoint=first.append).run(
        task, "e0"
    )
    assert "resumed" not in whole.info and len(first) == 3
    client.version = 1
    second: list[Any] = []
    (once,) = await EpisodeRunner(client, tokenizer, config, checkpoint=second.append).resume(
        first[0]
    )
    at = {"segment": 0, "token": len(first[0].segments[0].token_ids), "turn": 1, "version": 0}
    assert once.info["resumed"] == [at]
    assert once.token_ids.tolist() == whole.token_ids.tolist()  # the same prefix, continued
    assert second and all(s.info["resumed"] == [at] for s in second)  # in its checkpoints too
    client.version = 2
    (twice,) = await EpisodeRunner(client, tokenizer, config).resume(second[-1])
    again = {
        "segment": 0,
        "token": len(second[-1].segments[0].token_ids),
        "turn": second[-1].turn,
        "version": 1,
    }
    assert twice.info["resumed"] == [at, again]
    fork_point = dataclasses.replace(first[1], version=-1, info={})
    (fork,) = await EpisodeRunner(client, tokenizer, config).resume(fork_point)
    assert "resumed" not in fork.info

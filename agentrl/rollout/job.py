"""``agentrl rollout``: run an env against a model for N episodes, without training.

For evaluation and data collection. Writes to the run directory:

* ``trajectories.jsonl``: one trajectory per line (token ids, behaviour logprobs,
  per-token versions, loss mask, spans, messages, rewards, status and reason), written
  as each group completes, so an interrupted run keeps what it finished;
* ``failed_attempts.jsonl``: attempts that failed and were retried;
* ``summary.json``: counts, success rate, tokens/s, errors by kind, loop lag.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from agentrl.types import Group


@dataclasses.dataclass(frozen=True, slots=True)
class RolloutJob:
    env_id: str
    episodes: int
    out_dir: Path
    model: str = "tiny"
    group_size: int = 1
    concurrency: int = 64
    via_server: bool = False
    first_seed: int = 0
    max_turns: int = 8
    max_tokens_per_turn: int = 64
    temperature: float = 1.0


async def run_rollout(job: RolloutJob) -> dict[str, Any]:
    """Run the job with a live progress bar; return the summary it writes."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from agentrl.errors import ConfigError
    from agentrl.inference import InferenceConfig, VLLMEngineClient, VLLMServer, VLLMServerClient
    from agentrl.metrics import LoopLagMonitor
    from agentrl.queue import TrajectoryQueue
    from agentrl.rollout import EpisodeRunner, RolloutConfig, Scheduler, SchedulerConfig, tasks_for

    if job.episodes < 1 or job.episodes % job.group_size:
        raise ConfigError(
            f"--episodes ({job.episodes}) must be a positive multiple of --group-size "
            f"({job.group_size})"
        )
    out = Path(job.out_dir)
    path, tokenizer = await asyncio.to_thread(_prepare, job, out)
    config = InferenceConfig(model=path)
    rollout = RolloutConfig(max_turns=job.max_turns, max_tokens_per_turn=job.max_tokens_per_turn,
                            temperature=job.temperature)  # fmt: skip
    groups = job.episodes // job.group_size
    summary: dict[str, Any] = {}

    async def run(client: Any) -> None:
        runner = EpisodeRunner(client, tokenizer, rollout)
        queue = TrajectoryQueue(max(groups, 1))
        written = {"episodes": 0, "success": 0}
        with (out / "trajectories.jsonl").open("w") as sink, Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"), TimeElapsedColumn(),
        ) as progress:  # fmt: skip
            bar = progress.add_task(job.env_id, total=job.episodes, stats="")
            started = time.perf_counter()

            def on_group(group: Group) -> None:
                for t in group.trajectories:
                    sink.write(json.dumps(t.to_json()) + "\n")
                sink.flush()
                written["episodes"] += len(group.episodes)
                written["success"] += sum(r > 0 for r in group.rewards)
                counters = runner.metrics.counters
                rate = counters["tokens_sampled"] / max(time.perf_counter() - started, 1e-9)
                errors = {k.split("/", 1)[1]: v for k, v in counters.items() if "/" in k}
                progress.update(bar, completed=written["episodes"],
                                stats=f"{rate:,.0f} tok/s  errors {errors or 0}")  # fmt: skip

            scheduler = Scheduler(
                runner,
                queue,
                SchedulerConfig(concurrency=max(job.concurrency, job.group_size),
                                group_size=job.group_size),
                on_group=on_group,
            )  # fmt: skip
            async with LoopLagMonitor(runner.metrics):
                await scheduler.run(tasks_for(job.env_id, groups, first_seed=job.first_seed))
            elapsed = time.perf_counter() - started
        with (out / "failed_attempts.jsonl").open("w") as failed:
            for t in scheduler.failed_attempts:
                failed.write(json.dumps(t.to_json()) + "\n")
        snap = runner.metrics.snapshot()
        summary.update(
            env_id=job.env_id,
            model=str(path),
            episodes=written["episodes"],
            success_rate=written["success"] / max(written["episodes"], 1),
            tokens_sampled=snap.get("tokens_sampled", 0),
            tokens_per_s=snap.get("tokens_sampled", 0) / elapsed,
            wall_s=elapsed,
            metrics=snap,
        )

    if job.via_server:
        async with await VLLMServer.start(config, log_dir=out / "logs") as server:
            async with VLLMServerClient(server.url, config) as client:
                await run(client)
    else:
        async with await VLLMEngineClient.start(config) as client:
            await run(client)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _prepare(job: RolloutJob, out: Path) -> tuple[str, Any]:
    """Fail fast on an unknown env before vLLM starts; make the run dir; load the tokenizer."""
    import gymnasium as gym
    from transformers import AutoTokenizer

    from agentrl.env import make_env
    from agentrl.errors import ConfigError
    from agentrl.models import resolve_model

    try:
        make_env(job.env_id).close()
    except gym.error.Error as e:
        raise ConfigError(f"cannot make env {job.env_id!r}: {e}") from e
    out.mkdir(parents=True, exist_ok=True)
    path = resolve_model(job.model)
    return path, AutoTokenizer.from_pretrained(path)

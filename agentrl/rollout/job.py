"""``agentrl rollout``: run an env against a model for N episodes, without training.

For evaluation and data collection. The run directory holds:

* ``episodes.db``: the episode store (the source of truth): every task, every episode
  with its state, checkpoints of unfinished episodes (at every turn boundary), and the
  finished trajectories. A killed run continues with ``--resume``: finished episodes
  are kept, checkpointed ones continue from their checkpoint, and the rest run.
* ``trajectories.jsonl``: one trajectory per line (token ids, behaviour logprobs,
  per-token versions, loss mask, spans, messages, rewards, status and reason), exported
  from the store when the run ends;
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

from agentrl.errors import ConfigError
from agentrl.store import STORE_FILE, EpisodeStore
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

    def settings(self) -> dict[str, Any]:
        """What a resumed run must reuse (everything but the run directory)."""
        out = dataclasses.asdict(self)
        del out["out_dir"]
        return out


def resumed_job(out_dir: Path, env_id: str | None = None) -> RolloutJob:
    """The job recorded in ``out_dir``'s store, to continue it."""
    if not (out_dir / STORE_FILE).exists():
        raise ConfigError(
            f"--resume: {str(out_dir)!r} holds no episode store ({STORE_FILE}); give the run "
            f"directory of an earlier `agentrl rollout` with --out"
        )
    with EpisodeStore.open(out_dir, create=False) as store:
        runs = store.runs()
    first = next((r for r in runs if r["kind"] == "rollout"), None)
    if first is None:
        raise ConfigError(f"--resume: {str(out_dir)!r} was not written by `agentrl rollout`")
    job = RolloutJob(out_dir=out_dir, **first["config"])
    if env_id is not None and env_id != job.env_id:
        raise ConfigError(
            f"--resume: {str(out_dir)!r} is a rollout of {job.env_id!r}, not {env_id!r}"
        )
    return job


async def run_rollout(job: RolloutJob, *, resume: bool = False) -> dict[str, Any]:
    """Run (or continue) the job with a live progress bar; return the summary it writes."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from agentrl.inference import InferenceConfig, VLLMEngineClient, VLLMServer, VLLMServerClient
    from agentrl.metrics import LoopLagMonitor, tune_gc
    from agentrl.queue import TrajectoryQueue
    from agentrl.rollout import EpisodeRunner, RolloutConfig, Scheduler, SchedulerConfig, tasks_for
    from agentrl.store import StoreWriter

    if job.episodes < 1 or job.episodes % job.group_size:
        raise ConfigError(
            f"--episodes ({job.episodes}) must be a positive multiple of --group-size "
            f"({job.group_size})"
        )
    out = Path(job.out_dir)
    if not resume and (out / STORE_FILE).exists():
        raise ConfigError(
            f"{str(out)!r} already holds a run; continue it with --resume, or choose another --out"
        )
    path, tokenizer = await asyncio.to_thread(_prepare, job, out)
    config = InferenceConfig(model=path)
    rollout = RolloutConfig(max_turns=job.max_turns, max_tokens_per_turn=job.max_tokens_per_turn,
                            temperature=job.temperature)  # fmt: skip
    groups = job.episodes // job.group_size
    summary: dict[str, Any] = {}
    store = EpisodeStore.open(out)
    store.begin_run("rollout", job.settings())
    states = store.task_states()
    all_tasks = list(tasks_for(job.env_id, groups, first_seed=job.first_seed))
    todo = [t for t in all_tasks if states.get(t.task_id, "pending") == "pending"]
    already = (len(all_tasks) - len(todo)) * job.group_size

    async def run(client: Any) -> None:
        async with StoreWriter(store) as writer:
            runner = EpisodeRunner(client, tokenizer, rollout, checkpoint=writer.partial)
            queue = TrajectoryQueue(max(groups, 1))
            tune_gc()
            done = {"episodes": already}
            with Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"), TimeElapsedColumn(),
            ) as progress:  # fmt: skip
                bar = progress.add_task(job.env_id, total=job.episodes, completed=already,
                                        stats="resumed" if resume else "")  # fmt: skip
                started = time.perf_counter()

                def on_group(group: Group) -> None:
                    done["episodes"] += len(group.episodes)
                    counters = runner.metrics.counters
                    rate = counters["tokens_sampled"] / max(time.perf_counter() - started, 1e-9)
                    errors = {k.split("/", 1)[1]: v for k, v in counters.items() if "/" in k}
                    progress.update(bar, completed=done["episodes"],
                                    stats=f"{rate:,.0f} tok/s  errors {errors or 0}")  # fmt: skip

                scheduler = Scheduler(
                    runner,
                    queue,
                    SchedulerConfig(concurrency=max(job.concurrency, job.group_size),
                                    group_size=job.group_size),
                    on_group=on_group,
                    writer=writer,
                    resume=resume,
                )  # fmt: skip
                async with LoopLagMonitor(runner.metrics):
                    await scheduler.run(todo)
                elapsed = time.perf_counter() - started
        snap = runner.metrics.snapshot()
        summary.update(
            tokens_sampled=snap.get("tokens_sampled", 0),
            tokens_per_s=snap.get("tokens_sampled", 0) / elapsed,
            wall_s=elapsed,
            metrics=snap,
        )

    try:
        if job.via_server:
            async with await VLLMServer.start(config, log_dir=out / "logs") as server:
                async with VLLMServerClient(server.url, config) as client:
                    await run(client)
        else:
            async with await VLLMEngineClient.start(config) as client:
                await run(client)
        summary.update(await asyncio.to_thread(_export, store, out))
    finally:
        store.close()
    summary.update(env_id=job.env_id, model=str(path), resumed=resume)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _export(store: EpisodeStore, out: Path) -> dict[str, Any]:
    """Write the JSONL files from the store; return the episode counts."""
    episodes: dict[str, float] = {}
    with (out / "trajectories.jsonl").open("w") as sink:
        for t in store.all_trajectories():
            sink.write(json.dumps(t.to_json()) + "\n")
            episodes.setdefault(t.episode_id, t.reward)
    with (out / "failed_attempts.jsonl").open("w") as failed:
        for row in store.episodes(state="retried"):
            for t in store.trajectories(row["episode_id"], row["attempt"]):
                failed.write(json.dumps(t.to_json()) + "\n")
    return {
        "episodes": len(episodes),
        "success_rate": sum(r > 0 for r in episodes.values()) / max(len(episodes), 1),
        "store": store.stats(),
    }


def _prepare(job: RolloutJob, out: Path) -> tuple[str, Any]:
    """Fail fast on an unknown env before vLLM starts; make the run dir; load the tokenizer."""
    import gymnasium as gym
    from transformers import AutoTokenizer

    from agentrl.env import make_env
    from agentrl.models import resolve_model

    try:
        make_env(job.env_id).close()
    except gym.error.Error as e:
        raise ConfigError(f"cannot make env {job.env_id!r}: {e}") from e
    out.mkdir(parents=True, exist_ok=True)
    path = resolve_model(job.model)
    return path, AutoTokenizer.from_pretrained(path)

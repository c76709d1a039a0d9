"""``agentrl rollout``: run an env against a model for N episodes, without training.

For evaluation and data collection; ``agentrl eval`` is a job of kind "eval" (k samples a
task as the group, scored by :mod:`agentrl.evaluation`). The run directory holds:

* ``episodes.db``: the episode store (the source of truth): every task, every episode
  with its state, checkpoints of unfinished episodes (see
  ``rollout.checkpoint_interval_s``), and the finished trajectories. A killed run
  continues with ``--resume``: finished episodes are kept, checkpointed ones continue
  from their checkpoint, and the rest run.
* ``trajectories.jsonl``: one trajectory per line (token ids, behaviour logprobs,
  per-token versions, loss mask, spans, messages, rewards, status and reason), exported
  from the store when the run ends;
* ``failed_attempts.jsonl``: attempts that failed and were retried;
* ``summary.json``: counts, success rate, tokens/s, errors by kind, loop lag.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from agentrl.config import RunConfig
from agentrl.errors import ConfigError
from agentrl.store import STORE_FILE, EpisodeStore
from agentrl.types import Group, Task

ROLLOUT_KIND = "rollout"


@dataclasses.dataclass(frozen=True, slots=True)
class RolloutJob:
    """``episodes`` episodes of ``config.env.id`` (``config.rollout.group_size`` per task).

    ``config`` is the same tree ``agentrl train`` reads: ``[model]``, ``[env]``,
    ``[inference]`` and ``[rollout]`` apply (``inference.mode = "server"`` goes through
    one `vllm serve` agentrl starts); the other sections are recorded, not used.
    """

    config: RunConfig
    episodes: int
    out_dir: Path
    kind: str = ROLLOUT_KIND
    """What the store records the run as: "rollout", or "eval" (`agentrl eval`)."""
    adapter: str | None = None
    """A peft adapter folder served on top of ``config.model.path`` (a LoRA run's model)."""
    source: str = ""
    """Where the model came from, in words (recorded; `agentrl eval` says it)."""

    @property
    def env_id(self) -> str:
        return self.config.env.id

    def settings(self) -> dict[str, Any]:
        """What the store records (a resumed run reuses it): the config and the count."""
        job = {"episodes": self.episodes, "adapter": self.adapter, "source": self.source}
        return {**self.config.to_dict(), "job": job}


def recorded_config(store: EpisodeStore) -> tuple[RunConfig, dict[str, Any]]:
    """The config a run directory's first run recorded (train or rollout), and the
    rollout job's extras (``{"episodes": N}``; empty for a train run).

    Raises:
        ConfigError: the store records no run, or one from an older agentrl.
    """
    runs = store.runs()
    if not runs:
        raise ConfigError(f"{store.path.parent} records no run (its store has no runs table rows)")
    settings = dict(runs[0]["config"])
    extras = settings.pop("job", {})
    try:
        return RunConfig.from_dict(settings), extras
    except ConfigError as e:
        raise ConfigError(
            f"{store.path.parent} was recorded by an older agentrl whose config this version "
            f"cannot read ({e}); pass the settings on the command line instead"
        ) from None


def resumed_job(
    out_dir: Path, env_id: str | None = None, *, kind: str = ROLLOUT_KIND
) -> RolloutJob:
    """The job recorded in ``out_dir``'s store, to continue it (``kind``: the command
    that must have written it, "rollout" or "eval")."""
    if not (out_dir / STORE_FILE).exists():
        raise ConfigError(
            f"--resume: {str(out_dir)!r} holds no episode store ({STORE_FILE}); give the run "
            f"directory of an earlier `agentrl {kind}` with --out"
        )
    with EpisodeStore.open(out_dir, create=False) as store:
        runs = store.runs()
        if not runs or runs[0]["kind"] != kind:
            raise ConfigError(f"--resume: {str(out_dir)!r} was not written by `agentrl {kind}`")
        config, extras = recorded_config(store)
    job = RolloutJob(
        config=config,
        episodes=int(extras["episodes"]),
        out_dir=out_dir,
        kind=kind,
        adapter=extras.get("adapter"),
        source=str(extras.get("source", "")),
    )
    if env_id is not None and env_id != job.env_id:
        raise ConfigError(
            f"--resume: {str(out_dir)!r} is a{'n' if kind == 'eval' else ''} {kind} of "
            f"{job.env_id!r}, not {env_id!r}"
        )
    return job


async def run_rollout(job: RolloutJob, *, resume: bool = False) -> dict[str, Any]:
    """Run (or continue) the job with a live progress bar; return the summary it writes."""
    from agentrl.inference import VLLMEngineClient, VLLMServer, VLLMServerClient
    from agentrl.rollout import tasks_for

    cfg = job.config
    group_size = cfg.rollout.group_size
    if job.episodes < 1 or job.episodes % group_size:
        raise ConfigError(
            f"--episodes ({job.episodes}) must be a positive multiple of --group-size "
            f"({group_size}) (rollout.group_size)"
        )
    out = Path(job.out_dir)
    if not resume and (out / STORE_FILE).exists():
        raise ConfigError(
            f"{str(out)!r} already holds a run; continue it with --resume, or choose another --out"
        )
    path, tokenizer = await asyncio.to_thread(_prepare, job, out)
    store = EpisodeStore.open(out)
    store.begin_run(job.kind, job.settings())
    states = store.task_states()
    all_tasks = list(
        tasks_for(
            job.env_id, job.episodes // group_size, first_seed=cfg.env.first_seed, **cfg.env.kwargs
        )
    )
    todo = [t for t in all_tasks if states.get(t.task_id, "pending") == "pending"]
    already = (len(all_tasks) - len(todo)) * group_size
    summary: dict[str, Any] = {}
    try:
        if cfg.inference.mode == "server":
            if job.adapter:
                raise ConfigError(
                    f"a LoRA adapter ({job.adapter}) is served in engine mode only; "
                    f'set --inference.mode="engine"'
                )
            async with await VLLMServer.start(
                path, cfg.inference, seed=cfg.run.seed, log_dir=out / "logs"
            ) as server:
                async with VLLMServerClient(server.url, cfg.inference) as client:
                    summary = await _run(job, client, tokenizer, store, todo, already, resume)
        else:
            rank = max(16, cfg.trainer.lora.r) if job.adapter else None
            async with await VLLMEngineClient.start(
                path, cfg.inference, seed=cfg.run.seed, max_lora_rank=rank, log_dir=out / "logs"
            ) as client:
                if job.adapter:
                    await client.load_lora_adapter(job.adapter, version=0)
                summary = await _run(job, client, tokenizer, store, todo, already, resume)
        summary.update(await asyncio.to_thread(_export, store, out))
    finally:
        store.close()
    summary.update(env_id=job.env_id, model=str(path), resumed=resume)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


async def _run(
    job: RolloutJob,
    client: Any,
    tokenizer: Any,
    store: EpisodeStore,
    todo: list[Task],
    already: int,
    resume: bool,
) -> dict[str, Any]:
    """The episodes still to do, through one scheduler, with the progress bar (their
    envs on the env servers of ``[env] url``/``urls``, if the config names some)."""
    cfg = job.config
    async with contextlib.AsyncExitStack() as stack:
        extra = {}
        if cfg.env.remote:  # the episodes run on env servers ([env] url/urls)
            from agentrl.remote import EnvServerPool

            pool = await stack.enter_async_context(EnvServerPool.from_config(cfg.env))
            extra["make"] = pool.make
        return await _run_scheduler(job, client, tokenizer, store, todo, already, resume, extra)


async def _run_scheduler(
    job: RolloutJob,
    client: Any,
    tokenizer: Any,
    store: EpisodeStore,
    todo: list[Task],
    already: int,
    resume: bool,
    extra: dict[str, Any],
) -> dict[str, Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from agentrl.queue import TrajectoryQueue
    from agentrl.rollout import Scheduler
    from agentrl.rollout.workers import open_runner
    from agentrl.runtime.metrics import LoopLagMonitor, tune_gc
    from agentrl.store import StoreWriter

    cfg = job.config
    async with StoreWriter(store) as writer, contextlib.AsyncExitStack() as stack:
        runner = await open_runner(
            stack,
            client,
            tokenizer,
            cfg.rollout,
            model=cfg.model,
            imports=cfg.env.imports,
            checkpoint=writer.partial,
            make=extra.get("make"),
            env=cfg.env,
        )
        queue = TrajectoryQueue(max(job.episodes // cfg.rollout.group_size, 1))
        tune_gc()
        done = {"episodes": already}
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
        ) as progress:
            bar = progress.add_task(
                job.env_id, total=job.episodes, completed=already, stats="resumed" if resume else ""
            )
            started = time.perf_counter()

            def on_group(group: Group) -> None:
                done["episodes"] += len(group.episodes)
                counters = runner.metrics.counters
                rate = counters["tokens_sampled"] / max(time.perf_counter() - started, 1e-9)
                errors = {k.split("/", 1)[1]: v for k, v in counters.items() if "/" in k}
                progress.update(
                    bar,
                    completed=done["episodes"],
                    stats=f"{rate:,.0f} tok/s  errors {errors or 0}",
                )

            scheduler = Scheduler(
                runner, queue, cfg.rollout, on_group=on_group, writer=writer, resume=resume
            )
            async with LoopLagMonitor(runner.metrics):
                await scheduler.run(todo)
            elapsed = time.perf_counter() - started
    snap = runner.metrics.snapshot()
    tokens = snap.get("tokens_sampled", 0)
    return {
        "tokens_sampled": tokens,
        "tokens_per_s": tokens / elapsed,
        "wall_s": elapsed,
        "metrics": snap,
    }


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
        if not job.config.env.remote:  # envs on env servers were checked by check_servers
            make_env(job.env_id, **job.config.env.kwargs).close()
    except gym.error.Error as e:
        raise ConfigError(f"cannot make env {job.env_id!r}: {e}") from e
    out.mkdir(parents=True, exist_ok=True)
    path = resolve_model(job.config.model.path)
    return path, AutoTokenizer.from_pretrained(path)

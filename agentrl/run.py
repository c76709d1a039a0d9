"""``agentrl train CONFIG.toml``: the whole job, wired in one ``asyncio.TaskGroup``.

The run directory (``run.out``, default ``runs/NAME-TIME``) holds::

    config.toml       the resolved config (every key, defaults included)
    episodes.db       the episode store: tasks, episodes, checkpoints, trajectories
    metrics.jsonl     one JSON object per optimizer step (kind "train") and per
                      evaluation (kind "eval")
    tb/               the same scalars as TensorBoard event files
    checkpoints/      trainer checkpoints (weights, optimizer, RNG), newest two
    model/            the final weights and tokenizer (loads in transformers and vLLM)
    trace.json        a Perfetto / Chrome trace of generation, tools, envs, training
                      steps and weight syncs
    plots/            reward.png, staleness.png, throughput.png
    status.json       live state for `agentrl top` (rewritten twice a second)
    logs/             vLLM server logs (inference.mode = "server")

``agentrl train --resume RUN_DIR`` continues a killed or interrupted run from its
store and last checkpoint: no task is skipped or trained twice.

This module builds the components and runs them, as the architecture diagram
(``docs/architecture.md``) draws them. The live status is :mod:`agentrl.status`'s,
what the user sees :mod:`agentrl.monitor`'s; the other ranks of a multi-process run,
:mod:`agentrl.trainer.distributed`'s; checkpoints and the final model,
:mod:`agentrl.trainer.checkpoint`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.config import RunConfig
from agentrl.env import import_env_modules, load_env_plugins
from agentrl.evaluation import DURING, PeriodicEval, eval_line, evaluate
from agentrl.monitor import MetricsLog, live_display, plain_line
from agentrl.run_setup import (
    CONFIG_FILE,
    check_config,
    explain_failure,
    init_run_dir,
    prepare,
)
from agentrl.run_start import (
    EngineSleep,
    lora_rank,
    start_env_servers,
    start_inference,
    start_trainer,
    weights_dir,
)
from agentrl.runtime.metrics import LoopLagMonitor, Metrics, tune_gc
from agentrl.runtime.tracing import Tracer
from agentrl.status import Reporter, RunStatus

if TYPE_CHECKING:
    from agentrl.inference import InferenceClient, ServerPool
    from agentrl.queue import TrajectoryQueue
    from agentrl.store import EpisodeStore, StoreWriter
    from agentrl.trainer.loop import StepRecord, TrainLoop
    from agentrl.trainer.trainer import Trainer
    from agentrl.types import Task

__all__ = [
    "CONFIG_FILE",
    "TrainResult",
    "check_config",
    "explain_failure",
    "lora_rank",
    "prepare",
    "train",
]

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class TrainResult:
    run_dir: Path
    steps: int
    wall_s: float
    eval_before: dict[str, Any] | None = None
    eval_after: dict[str, Any] | None = None
    last: dict[str, Any] = dataclasses.field(default_factory=dict)
    loop_s: float = 0.0
    """Wall time of the training loop alone (no startup, no evaluation)."""
    busy: dict[str, float] = dataclasses.field(default_factory=dict)
    """Seconds during the loop with generation running, training, publishing."""


@dataclasses.dataclass(frozen=True, slots=True)
class _RunOutput:
    """Where one run reports: its folder, live status, trace, metrics log, terminal."""

    config: RunConfig
    run_dir: Path
    status: RunStatus
    tracer: Tracer
    log: MetricsLog
    reporter: Reporter
    make: Callable[..., Any] | None = None
    """Builds the envs: the env servers' pool with ``[env] url``; None: Gymnasium's."""


async def train(
    config: RunConfig,
    run_dir: Path,
    *,
    resume: bool = False,
    accelerator: Any = None,
    reporter: Reporter | None = None,
    placement: Callable[[], list[dict[str, Any]]] | None = None,
) -> TrainResult:
    """Run (or continue) the job described by ``config`` in ``run_dir``.

    ``accelerator``: an ``accelerate.Accelerator`` when launched as rank 0 of several
    processes (``accelerate launch`` / ``torchrun``); the other ranks run
    :func:`agentrl.trainer.distributed.follow_run`. ``reporter``: where the progress
    lines and warnings go (default: the terminal; ``log.progress = "none"`` keeps
    only the warnings). ``placement``: where the trainer ranks run, when they are Ray
    actors (:meth:`agentrl.cluster.ranks.TrainerRanks.placement`; status.json's rows).
    """
    from agentrl.models import resolve_model
    from agentrl.store import EpisodeStore

    load_env_plugins()
    import_env_modules(config.env.imports)
    await asyncio.to_thread(init_run_dir, config, run_dir, resume)
    if config.log.progress != "none":
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # "Writing model shards" bars break the display
    status = RunStatus(config, run_dir, Metrics())
    if placement is not None:
        status.add_placement(placement)
    model_path = await asyncio.to_thread(resolve_model, config.model.path)
    out = _RunOutput(
        config,
        run_dir,
        status,
        Tracer(run_dir / "trace.json" if config.log.trace else None),
        MetricsLog(
            run_dir,
            tensorboard=config.log.tensorboard,
            wandb=config.log.wandb,
            trackio=config.log.trackio,
            name=config.run.name,
            config=config.to_dict(),
        ),
        (reporter or Reporter()).with_progress(config.log.progress != "none"),
    )
    store = EpisodeStore.open(run_dir)
    store.begin_run("train", config.to_dict())
    display = live_display(config.log.progress)
    result = TrainResult(run_dir, 0, 0.0)
    await asyncio.to_thread(status.write)
    try:
        with display if display is not None else contextlib.nullcontext():
            await _train(
                out, model_path, store, display, result, resume=resume, accelerator=accelerator
            )
        status.state = "finished"
    except (KeyboardInterrupt, asyncio.CancelledError):
        status.state = "interrupted"
        raise
    except BaseException as e:
        status.ended(e)
        raise
    finally:
        result.wall_s = time.perf_counter() - status.started
        _close(out, store)
    return result


async def _train(
    out: _RunOutput,
    model_path: str,
    store: EpisodeStore,
    display: Any,
    result: TrainResult,
    *,
    resume: bool,
    accelerator: Any,
) -> None:
    """Build the components (the architecture diagram, left to right) and run them."""
    out.reporter.say(f"run directory: {out.run_dir}")
    trainer = await start_trainer(
        out.config, model_path, accelerator, resume, out.reporter, out.run_dir
    )
    async with contextlib.AsyncExitStack() as stack:
        if trainer.recorder is not None:
            stack.callback(trainer.recorder.close)
        out, parts = await _start_rollout(out, model_path, trainer, store, stack)
        loop, queue, periodic = await _build_loop(
            out, parts, trainer, store, display, stack, resume=resume
        )
        status = out.status
        status.attach(trainer=trainer, runner=parts.runner, queue=queue, loop=loop, pool=parts.pool)
        tune_gc()
        if resume:
            step = await loop.restore()
            out.reporter.say(
                f"resumed at step {step} (version {trainer.version}); "
                f"{len(queue)} complete groups to train first"
            )
        async with asyncio.TaskGroup() as tg:
            ticker = tg.create_task(status.ticker(display), name="status")
            lag = LoopLagMonitor(status.metrics).start()
            try:
                await _evaluate_train_evaluate(
                    out, parts.client, trainer, loop, store, result, periodic
                )
            finally:
                await lag.stop()
                ticker.cancel()
        result.steps = trainer.step
        result.last = dict(status.last)


@dataclasses.dataclass(frozen=True, slots=True)
class _Rollout:
    """The rollout side of a run, started: inference, the store's writer, the runner."""

    client: InferenceClient
    pool: ServerPool | None
    writer: StoreWriter
    runner: Any


async def _start_rollout(
    out: _RunOutput,
    model_path: str,
    trainer: Trainer,
    store: EpisodeStore,
    stack: contextlib.AsyncExitStack,
) -> tuple[_RunOutput, _Rollout]:
    """The cluster (``[cluster]``), inference, env servers, the store's writer and the
    episode runner, each in ``stack``; ``out`` with the cluster's config and the envs' make."""
    from agentrl.cluster.start import start_cluster
    from agentrl.cluster.workers import open_cluster_runner as open_runner
    from agentrl.store import StoreWriter

    cfg = out.config
    cluster = await start_cluster(cfg, out.run_dir, stack, status=out.status, say=out.reporter.say)
    out = dataclasses.replace(out, config=(cfg := cluster.config))
    client, pool = await start_inference(
        cfg, model_path, out.run_dir / "logs", stack, out.reporter, cluster.managed
    )
    make = await start_env_servers(cfg, stack, out.reporter)
    if make is not None:
        out = dataclasses.replace(out, make=make)
    writer = await stack.enter_async_context(StoreWriter(store))
    runner = await open_runner(
        stack,
        client,
        trainer.tokenizer,
        cfg.rollout,
        cluster=cfg.cluster,
        model=cfg.model,
        imports=cfg.env.imports,
        metrics=out.status.metrics,
        checkpoint=writer.partial,
        tracer=out.tracer,
        make=out.make,
        env=cfg.env,
        env_handles=cluster.env_handles,
        status=out.status,
    )
    return out, _Rollout(client, pool, writer, runner)


async def _build_loop(
    out: _RunOutput,
    parts: _Rollout,
    trainer: Trainer,
    store: EpisodeStore,
    display: Any,
    stack: contextlib.AsyncExitStack,
    *,
    resume: bool,
) -> tuple[TrainLoop, TrajectoryQueue, PeriodicEval]:
    """The weight controller, queue, scheduler, publisher and evaluation beside training,
    and the training loop over them."""
    from agentrl.queue import TrajectoryQueue
    from agentrl.rollout import Scheduler
    from agentrl.rollout.controller import RolloutController
    from agentrl.trainer.loop import TrainLoop
    from agentrl.trainer.publish import WeightPublisher

    cfg, metrics, runner = out.config, out.status.metrics, parts.runner
    controller = RolloutController(
        runner,
        writer=parts.writer,
        policy=cfg.rollout.update_policy,
        max_staleness=cfg.rollout.max_staleness,
        metrics=metrics,
    )
    queue = TrajectoryQueue(2 * cfg.train.groups_per_step)
    scheduler = Scheduler(
        runner,
        queue,
        cfg.rollout,
        batch_size=cfg.batch_size(),
        version=lambda: trainer.version,
        metrics=metrics,
        writer=parts.writer,
        resume=resume,
    )
    directory = await asyncio.to_thread(weights_dir, cfg.inference.weights_dir)
    publisher = WeightPublisher(trainer, controller, directory=directory)
    stack.callback(publisher.close)

    def beside(step: int) -> Awaitable[Any]:  # episodes wait at training's gate too
        return _evaluate(out, parts.client, trainer, DURING, step=step, admission=runner.admission)

    periodic = await stack.enter_async_context(
        PeriodicEval(cfg.eval.every, cfg.train.steps, beside)
    )
    loop = TrainLoop(
        trainer,
        publisher,
        scheduler,
        queue,
        cfg.train,
        store=store,
        checkpoint_dir=out.run_dir / "checkpoints",
        on_step=_on_step(out, display, periodic),
        tracer=out.tracer,
        group_size=cfg.rollout.group_size,
        sleeper=EngineSleep(parts.client) if cfg.inference.sleep_during_train else None,
    )
    return loop, queue, periodic


def _on_step(out: _RunOutput, display: Any, periodic: PeriodicEval) -> Callable[[StepRecord], None]:
    """After each step: its row, health (stop_on), a plain line, an eval if due (eval.every)."""
    progress = out.config.log.progress
    plain = progress == "plain" or (progress == "auto" and display is None)

    def on_step(record: StepRecord) -> None:
        out.log.log(record.stats.step, out.status.record_step(record))
        out.status.health.raise_if_stopping(out.run_dir)
        if plain:
            out.reporter.say(plain_line(out.status.refresh()))
        periodic.step(record.stats.step)

    return on_step


async def _evaluate_train_evaluate(
    out: _RunOutput,
    client: InferenceClient,
    trainer: Trainer,
    loop: TrainLoop,
    store: EpisodeStore,
    result: TrainResult,
    periodic: PeriodicEval,
) -> None:
    """Evaluate (a fresh run), train (evaluating every ``eval.every`` steps), save, evaluate."""
    from agentrl.trainer.checkpoint import save_checkpoint, save_model

    cfg, status = out.config, out.status
    if cfg.eval.episodes and trainer.step == 0:
        result.eval_before = await _evaluate(out, client, trainer, "before")
    status.state = "training"
    tasks = _pending_tasks(cfg, store)
    gen0, t_loop = status.generation_s, time.perf_counter()
    await loop.run(tasks)
    result.loop_s = time.perf_counter() - t_loop
    await periodic.wait()  # the last one beside training ends before the one after it
    result.busy = {"generation_s": status.generation_s - gen0, **loop.busy}
    every = cfg.train.checkpoint_every
    if trainer.step and (not every or trainer.step % every) and not trainer.sharded:
        await asyncio.to_thread(save_checkpoint, trainer, out.run_dir / "checkpoints")
    await asyncio.to_thread(save_model, trainer, out.run_dir / "model")
    if cfg.eval.episodes:
        result.eval_after = await _evaluate(out, client, trainer, "after")


def _pending_tasks(cfg: RunConfig, store: EpisodeStore) -> Iterator[Task]:
    """The run's tasks in seed order, less those the store holds complete (queued) or trained."""
    from agentrl.rollout import tasks_for

    states = store.task_states()
    return (
        t
        for t in tasks_for(cfg.env.id, None, first_seed=cfg.env.first_seed, **cfg.env.kwargs)
        if states.get(t.task_id, "pending") == "pending"
    )


async def _evaluate(
    out: _RunOutput,
    client: InferenceClient,
    trainer: Trainer,
    label: str,
    *,
    step: int | None = None,
    admission: asyncio.Event | None = None,
) -> dict[str, Any]:
    """Run one evaluation (:func:`agentrl.evaluation.evaluate`) and record its row."""
    step = trainer.step if step is None else step
    summary = await evaluate(
        out.config,
        client,
        trainer.tokenizer,
        label,
        trainer.version,
        step=step,
        tracer=out.tracer,
        status=out.status,
        admission=admission,
        make=out.make,
    )
    out.status.evaluated(summary)
    out.log.log(step, summary, kind="eval")
    out.reporter.say(eval_line(summary, tools=out.status.tools))
    return summary


def _close(out: _RunOutput, store: EpisodeStore) -> None:
    """The last status.json, then close the trace, the metrics log and the store; plots."""
    with contextlib.suppress(OSError):
        out.status.write(episodes=False)
    out.tracer.close()
    out.log.close()
    store.close()
    if out.config.log.plots:
        from agentrl.plots import write_plots_at_end

        write_plots_at_end(out.run_dir)

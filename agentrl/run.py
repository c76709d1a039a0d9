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
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentrl.config import RunConfig
from agentrl.env import check_env_config, import_env_modules, load_env_plugins
from agentrl.errors import ConfigError, InfraError, RunDirError
from agentrl.metrics import LoopLagMonitor, Metrics, tune_gc
from agentrl.monitor import MetricsLog, plain_line, render, write_status
from agentrl.trace import EVAL, Tracer

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.toml"


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


def prepare(config_path: str | Path | None, overrides: list[str], *, resume: str | None = None
            ) -> tuple[RunConfig, Path]:  # fmt: skip
    """Load and check the config and choose the run directory; create nothing.

    With ``resume`` (a run directory), the config is the one recorded there, with
    ``overrides`` applied (e.g. ``--train.steps=60`` to train further).
    """
    if resume is not None:
        run_dir = Path(resume)
        recorded = run_dir / CONFIG_FILE
        if not recorded.is_file() or not (run_dir / "episodes.db").is_file():
            raise ConfigError(
                f"{run_dir} holds no `agentrl train` run to resume (it needs {CONFIG_FILE} "
                f"and episodes.db)"
            )
        if config_path is not None:
            raise ConfigError("give either a config file or --resume RUN_DIR, not both")
        config = RunConfig.load(recorded, overrides)
        _check_resumable(run_dir)
    else:
        if config_path is None:
            raise ConfigError("give a config file: agentrl train CONFIG.toml [--key.sub=value]")
        config = RunConfig.load(config_path, overrides)
        run_dir = Path(config.run.out or f"runs/{config.run.name}-{time.strftime('%Y%m%d-%H%M%S')}")
        if run_dir.exists() and any(run_dir.iterdir()):
            raise ConfigError(
                f"{run_dir} already holds files; continue that run with "
                f"`agentrl train --resume {run_dir}`, or set run.out to a new folder"
            )
    check_config(config)
    return config, run_dir


def check_config(config: RunConfig) -> None:
    """Every check a run needs before it starts: the config's own rules, the env id
    (after ``env.imports``) and the model.

    Raises:
        ConfigError: naming the key, the value and what is allowed.
    """
    from agentrl.models import check_chat_template, resolve_model

    config.check()
    check_env_config(config.env)
    if config.model.path != "tiny":
        path = resolve_model(config.model.path)  # raises ModelNotFoundError (a ConfigError)
        if Path(path).is_dir():
            check_chat_template(path)


def launched_rank() -> tuple[int, int]:
    """(rank, world size) set by ``accelerate launch`` or ``torchrun``; (0, 1) otherwise."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def make_accelerator() -> Any:
    """An ``accelerate.Accelerator`` for this launched process (CPU/gloo without CUDA).

    Its plugins (DDP, FSDP2) come from the ``accelerate launch`` config.
    """
    import torch
    from accelerate import Accelerator

    return Accelerator(cpu=not torch.cuda.is_available())


def follow(config: RunConfig, run_dir: Path, resume: bool, accelerator: Any) -> int:
    """A rank other than 0: the same trainer, fed by rank 0's broadcasts; no vLLM, no store.

    Returns the number of optimizer steps taken.
    """
    from agentrl.models import resolve_model
    from agentrl.trainer.checkpoint import latest_checkpoint, load_checkpoint
    from agentrl.trainer.distributed import follow as follow_steps
    from agentrl.trainer.trainer import Trainer

    load_env_plugins()
    import_env_modules(config.env.imports)
    trainer = Trainer(resolve_model(config.model.path), config.trainer,
                      temperature=config.rollout.temperature, seed=config.run.seed,
                      accelerator=accelerator)  # fmt: skip
    if resume:
        folder = latest_checkpoint(run_dir / "checkpoints")
        if folder is not None:
            if trainer._sharded():
                raise ConfigError(
                    "resuming a run trained with FSDP2 is not supported yet (its optimizer "
                    "checkpoint is not written); start a new run, or train with DDP"
                )
            load_checkpoint(trainer, folder)  # rank 0 loads the same checkpoint
    return follow_steps(trainer)


def _check_resumable(run_dir: Path) -> None:
    """Refuse, before anything is written, a run directory that cannot be continued."""
    from agentrl.store import EpisodeStore

    for path in (run_dir, *(run_dir / n for n in ("episodes.db", "metrics.jsonl", "trace.json",
                                                   "status.json", "checkpoints"))):  # fmt: skip
        if path.exists() and not os.access(path, os.W_OK):
            raise RunDirError(
                f"{path} is not writable (a read-only file system or no permission); nothing "
                f"was changed. Make {run_dir} writable, then run "
                f"`agentrl train --resume {run_dir}` again"
            )
    EpisodeStore.open(run_dir, create=False).close()  # corrupt, newer schema: StoreError
    _warn_leftover_engine(run_dir)


def _warn_leftover_engine(run_dir: Path) -> None:
    """Say so when the killed run's vLLM engine process still lives (it holds memory).

    A SIGKILLed `agentrl train` cannot stop its engine process, which lives on in the
    killed process's group. Killing by a recorded PID could hit an unrelated process
    that reused it, so this only tells the user.
    """
    import json

    try:
        pid = int(json.loads((run_dir / "status.json").read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    try:
        os.kill(pid, 0)
        return  # the leader lives: a run still going, or an unrelated process
    except ProcessLookupError:
        pass
    except PermissionError:
        return
    try:
        os.killpg(pid, 0)
    except (ProcessLookupError, PermissionError):
        return
    print(f"agentrl: warning: the previous run (pid {pid}) is gone but processes of its "
          f"group still run (vLLM's engine, holding memory); if they are yours, end them "
          f"with: kill -9 -{pid}", file=sys.stderr, flush=True)  # fmt: skip


class _Run:
    """The state of one `agentrl train` process, shared by its tasks."""

    def __init__(self, config: RunConfig, run_dir: Path, resume: bool) -> None:
        self.config = config
        self.run_dir = run_dir
        self.resume = resume
        self.metrics = Metrics()
        self.started = time.perf_counter()
        self.state = "starting"
        self.generation_s = 0.0
        self.status: dict[str, Any] = {}
        self.last: dict[str, Any] = {}
        self.evals: dict[str, dict[str, Any]] = {}
        self.prev_tokens = 0.0
        self.prev_time = time.perf_counter()
        self.components: dict[str, Any] = {}

    # ---- status -------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        c = self.components
        runner, trainer, queue, loop = (c.get("runner"), c.get("trainer"), c.get("queue"),
                                        c.get("loop"))  # fmt: skip
        now = time.monotonic()
        live = []
        if runner is not None:
            for p in list(runner.live.values()):
                live.append({"episode": p.episode_id, "env": p.env_id, "turn": p.turn,
                             "phase": p.phase, "started_version": p.started_version,
                             "tokens_by_version": dict(p.tokens_by_version),
                             "tool_calls": p.tool_calls, "age_s": now - p.started_at})  # fmt: skip
        counters = self.metrics.counters
        errors = {k: int(v) for k, v in counters.items()
                  if k.startswith(("failures/", "tool_errors/")) and v}  # fmt: skip
        busy = loop.busy if loop is not None else {}
        return {
            "name": self.config.run.name, "run_dir": str(self.run_dir), "pid": os.getpid(),
            "state": self.state, "updated_at": time.time(),
            "step": trainer.step if trainer is not None else 0,
            "steps": self.config.train.steps,
            "version": trainer.version if trainer is not None else 0,
            **{k: self.last.get(k) for k in ("reward_mean", "success_rate", "tool_use_rate",
                                              "tokens_per_s", "staleness_mean",
                                              "staleness_max")},
            "queue_depth": len(queue) if queue is not None else 0,
            "in_flight": len(live), "errors": errors,
            "time": {"wall_s": time.perf_counter() - self.started,
                     "generation_s": self.generation_s,
                     "training_s": busy.get("train_s", 0.0),
                     "publish_s": busy.get("publish_s", 0.0)},
            "eval": self.evals, "episodes": live,
            "servers": c["pool"].describe() if c.get("pool") is not None else [],
        }  # fmt: skip

    async def ticker(self, display: Any) -> None:
        """Sample generation busy time; rewrite status.json; refresh the display."""
        every = self.config.log.status_every_s
        last_write = 0.0
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.05)
            now = time.perf_counter()
            runners = (self.components.get("runner"), self.components.get("eval_runner"))
            if any(p.phase == "engine" for r in runners if r for p in r.live.values()):
                self.generation_s += now - last
            last = now
            if time.perf_counter() - last_write >= every:
                last_write = time.perf_counter()
                self.status = self.snapshot()
                await asyncio.to_thread(write_status, self.run_dir, self.status)
                if display is not None:
                    display.update(render(self.status, episodes=False))

    # ---- per step -------------------------------------------------------------------
    def step_values(self, record: Any) -> dict[str, Any]:
        s = record.stats
        trajectories = [t for g in record.groups for t in g.trajectories]
        success = self.config.eval.success_reward
        now = time.perf_counter()
        tokens = float(self.metrics.counters.get("tokens_sampled", 0))
        dt = max(now - self.prev_time, 1e-9)
        values = {
            **{k: v for k, v in s.as_dict().items() if k != "step"},
            "success_rate": _mean([t.reward >= success for t in trajectories]),
            "tool_use_rate": _mean(
                [any(sp.kind == "tool" for sp in t.spans) for t in trajectories]
            ),
            "episodes": len(trajectories),
            "tokens_per_s": (tokens - self.prev_tokens) / dt,
            "trained_tokens_per_s": s.tokens / dt,
            "train_s": record.train_s,
            "queue_depth": len(self.components["queue"]),
            "in_flight": len(self.components["runner"].live),
            "generation_busy_s": self.generation_s,
            "wall_s": now - self.started,
            "loop_lag_p99_s": self.metrics.percentile("loop_lag_s", 99),
        }
        if record.publish is not None:
            u = record.publish.update
            values.update(publish_s=u.pause_to_resume_s, reload_s=u.reload_s,
                          episodes_paused=u.episodes_paused,
                          tokens_reprefilled=u.tokens_reprefilled,
                          tokens_discarded=u.tokens_discarded)  # fmt: skip
        for k, v in self.metrics.counters.items():
            if k.startswith(("failures/", "tool_errors/")):
                values[f"errors/{k}"] = v
        self.prev_tokens, self.prev_time = tokens, now
        return values


def _mean(values: list[Any]) -> float:
    return sum(float(v) for v in values) / len(values) if values else float("nan")


async def evaluate(run: _Run, client: Any, tokenizer: Any, label: str, tracer: Tracer,
                   version: int) -> dict[str, Any]:  # fmt: skip
    """Run ``eval.episodes`` held-out episodes (one per seed) under the current weights."""
    from agentrl.rollout import EpisodeRunner, tasks_for

    cfg = run.config
    runner = EpisodeRunner(client, tokenizer,
                           dataclasses.replace(cfg.rollout, temperature=cfg.eval.temperature),
                           metrics=Metrics(), tracer=tracer)  # fmt: skip
    runner.trace_pid = EVAL
    slots = asyncio.Semaphore(cfg.rollout.concurrency)
    results: list[Any] = []

    async def one(task: Any) -> None:
        async with slots:
            trajectories = await runner.run(task, f"eval-{label}-{task.seed}")
            results.append(trajectories)

    tasks = list(tasks_for(cfg.env.id, cfg.eval.episodes, first_seed=cfg.eval.first_seed,
                           **cfg.env.kwargs))  # fmt: skip
    run.components["eval_runner"] = runner
    t0 = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for task in tasks:
            tg.create_task(one(task))
    finals = [trajs[-1] for trajs in results]
    return {
        "label": label, "version": version, "episodes": len(finals),
        "success_rate": _mean([t.reward >= cfg.eval.success_reward for t in finals]),
        "tool_use_rate": _mean([any(s.kind == "tool" for tr in trajs for s in tr.spans)
                                for trajs in results]),
        "reward_mean": _mean([t.reward for t in finals]),
        "failed": sum(t.status == "failed" for t in finals),
        "truncated": sum(t.status == "truncated" for t in finals),
        "wall_s": time.perf_counter() - t0,
    }  # fmt: skip


async def train(config: RunConfig, run_dir: Path, *, resume: bool = False,
                accelerator: Any = None) -> TrainResult:  # fmt: skip
    """Run (or continue) the job described by ``config`` in ``run_dir``.

    ``accelerator``: an ``accelerate.Accelerator`` when launched as rank 0 of several
    processes (``accelerate launch`` / ``torchrun``); the other ranks run :func:`follow`.
    """
    from agentrl.models import resolve_model
    from agentrl.store import EpisodeStore

    load_env_plugins()
    import_env_modules(config.env.imports)
    await asyncio.to_thread(_init_run_dir, config, run_dir, resume)
    if config.log.progress != "none":
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # "Writing model shards" bars break the display
    run = _Run(config, run_dir, resume)
    run.components["accelerator"] = accelerator
    model_path = await asyncio.to_thread(resolve_model, config.model.path)
    tracer = Tracer(run_dir / "trace.json" if config.log.trace else None)
    log = MetricsLog(run_dir, tensorboard=config.log.tensorboard, wandb=config.log.wandb,
                     trackio=config.log.trackio, name=config.run.name,
                     config=config.to_dict())  # fmt: skip
    store = EpisodeStore.open(run_dir)
    store.begin_run("train", config.to_dict())
    display = _display(config)
    result = TrainResult(run_dir, 0, 0.0)
    await asyncio.to_thread(write_status, run_dir, run.snapshot())
    try:
        with display if display is not None else contextlib.nullcontext():
            await _train(run, model_path, store, tracer, log, display, result)
        run.state = "finished"
    except (KeyboardInterrupt, asyncio.CancelledError):
        run.state = "interrupted"
        raise
    except BaseException:
        run.state = "failed"
        raise
    finally:
        result.wall_s = time.perf_counter() - run.started
        final = run.snapshot()
        final["episodes"] = []
        with contextlib.suppress(OSError):
            write_status(run_dir, final)
        tracer.close()
        log.close()
        store.close()
        if config.log.plots:
            with contextlib.suppress(Exception):
                from agentrl.plots import write_plots

                write_plots(run_dir)
    return result


_DISK_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM}


def explain_failure(error: BaseException, run_dir: Path) -> BaseException:
    """The one error a failed run reports: the first real cause, saying how to go on.

    Unwraps task-group exception groups; a write that failed for lack of space or
    permission becomes a :class:`RunDirError` naming the path.
    """
    leaf = error
    while isinstance(leaf, BaseExceptionGroup):
        real = [e for e in leaf.exceptions if not isinstance(e, asyncio.CancelledError)]
        leaf = (real or list(leaf.exceptions))[0]
    resume = f"agentrl train --resume {run_dir}"
    if isinstance(leaf, OSError) and leaf.errno in _DISK_ERRNOS:
        where = leaf.filename or run_dir
        return RunDirError(
            f"cannot write {where}: {leaf.strerror} ({errno.errorcode.get(leaf.errno, '?')}). "
            f"The run stopped; its episode store and last checkpoint are intact. Free space "
            f"or make {run_dir} writable, then continue with: {resume}"
        )
    if isinstance(leaf, InfraError):
        text = str(leaf).replace("RUN_DIR", str(run_dir))
        if "--resume" not in text:
            text = f"{text}. The run stopped; continue it with: {resume}"
        return InfraError(text) if text != str(leaf) else leaf
    return leaf


def _init_run_dir(config: RunConfig, run_dir: Path, resume: bool) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        tmp = run_dir / f".{CONFIG_FILE}.tmp"
        tmp.write_text(config.to_toml())
        os.replace(tmp, run_dir / CONFIG_FILE)


def _display(config: RunConfig) -> Any:
    mode = config.log.progress
    if mode == "auto":
        mode = "rich" if sys.stdout.isatty() else "plain"
    if mode != "rich":
        return None
    from rich.live import Live

    return Live(refresh_per_second=4, transient=False)


async def _train(run: _Run, model_path: str, store: Any, tracer: Tracer, log: MetricsLog,
                 display: Any, result: TrainResult) -> None:  # fmt: skip
    from agentrl.inference import VLLMEngineClient
    from agentrl.queue import TrajectoryQueue
    from agentrl.rollout import EpisodeRunner, Scheduler, tasks_for
    from agentrl.rollout.controller import RolloutController
    from agentrl.store import StoreWriter
    from agentrl.trainer.checkpoint import save_checkpoint
    from agentrl.trainer.loop import StepRecord, TrainLoop
    from agentrl.trainer.publish import WeightPublisher
    from agentrl.trainer.trainer import Trainer

    cfg = run.config
    plain = cfg.log.progress == "plain" or (cfg.log.progress == "auto" and display is None)
    say = print if cfg.log.progress != "none" else (lambda *a, **k: None)
    say(f"run directory: {run.run_dir}", flush=True)
    trainer = await asyncio.to_thread(Trainer, model_path, cfg.trainer,
                                      temperature=cfg.rollout.temperature, seed=cfg.run.seed,
                                      accelerator=run.components.get("accelerator"))  # fmt: skip
    if trainer._sharded() and (cfg.train.checkpoint_every or run.resume):
        raise ConfigError(
            "trainer checkpoints of FSDP2 runs are not written yet (the optimizer state is "
            "sharded); set train.checkpoint_every = 0, or train with DDP"
        )
    if trainer.world > 1:
        say(f"training on {trainer.world} processes ({trainer.accelerator.distributed_type}); "
            f"this is rank 0", flush=True)  # fmt: skip
    run.components["trainer"] = trainer
    batch = cfg.batch_size()

    async with contextlib.AsyncExitStack() as stack:
        if cfg.inference.mode == "server":
            client = await stack.enter_async_context(
                await _server_pool(cfg, model_path, run.run_dir / "logs", stack, say)
            )
            run.components["pool"] = client
        else:
            client = await stack.enter_async_context(
                await VLLMEngineClient.start(
                    model_path, cfg.inference, seed=cfg.run.seed, max_lora_rank=lora_rank(cfg)
                )
            )
        writer = await stack.enter_async_context(StoreWriter(store))
        runner = EpisodeRunner(client, trainer.tokenizer, cfg.rollout,
                               metrics=run.metrics, checkpoint=writer.partial,
                               tracer=tracer)  # fmt: skip
        controller = RolloutController(runner, writer=writer, policy=cfg.rollout.update_policy,
                                       max_staleness=cfg.rollout.max_staleness,
                                       metrics=run.metrics)  # fmt: skip
        queue = TrajectoryQueue(2 * cfg.train.groups_per_step)
        scheduler = Scheduler(runner, queue, cfg.rollout, batch_size=batch,
                              version=lambda: trainer.version, metrics=run.metrics,
                              writer=writer, resume=run.resume)  # fmt: skip
        weights_dir = await asyncio.to_thread(_weights_dir, cfg.inference.weights_dir)
        publisher = WeightPublisher(trainer, controller, directory=weights_dir)
        stack.callback(publisher.close)

        def on_step(record: StepRecord) -> None:
            values = run.step_values(record)
            run.last = values
            log.log(record.stats.step, values)
            if plain:
                run.status = run.snapshot()
                say(plain_line(run.status), flush=True)

        every = cfg.train.checkpoint_every
        loop = TrainLoop(trainer, publisher, scheduler, queue, cfg.train, store=store,
                         checkpoint_dir=run.run_dir / "checkpoints", on_step=on_step,
                         tracer=tracer)  # fmt: skip
        run.components.update(runner=runner, queue=queue, loop=loop)
        tune_gc()
        if run.resume:
            step = await loop.restore()
            scheduler.started = trainer.version * batch
            say(f"resumed at step {step} (version {trainer.version}); {len(queue)} complete "
                f"groups to train first", flush=True)  # fmt: skip

        async with asyncio.TaskGroup() as tg:
            ticker = tg.create_task(run.ticker(display), name="status")
            lag = LoopLagMonitor(run.metrics).start()
            try:
                if cfg.eval.episodes and trainer.step == 0:
                    run.state = "evaluating (before)"
                    ev = await evaluate(run, client, trainer.tokenizer, "before", tracer,
                                        trainer.version)  # fmt: skip
                    run.evals["before"] = ev
                    log.log(0, ev, kind="eval")
                    result.eval_before = ev
                    say(_eval_line(ev), flush=True)
                run.state = "training"
                states = store.task_states()
                tasks = (t for t in tasks_for(cfg.env.id, None, first_seed=cfg.env.first_seed,
                                              **cfg.env.kwargs)
                         if states.get(t.task_id, "pending") == "pending")  # fmt: skip
                gen0, t_loop = run.generation_s, time.perf_counter()
                await loop.run(tasks)
                result.loop_s = time.perf_counter() - t_loop
                result.busy = {"generation_s": run.generation_s - gen0, **loop.busy}
                if trainer.step and (not every or trainer.step % every) and not trainer._sharded():
                    await asyncio.to_thread(save_checkpoint, trainer, run.run_dir / "checkpoints")
                await asyncio.to_thread(_save_model, trainer, run.run_dir / "model")
                if cfg.eval.episodes:
                    run.state = "evaluating (after)"
                    ev = await evaluate(run, client, trainer.tokenizer, "after", tracer,
                                        trainer.version)  # fmt: skip
                    run.evals["after"] = ev
                    log.log(trainer.step, ev, kind="eval")
                    result.eval_after = ev
                    say(_eval_line(ev), flush=True)
            finally:
                await lag.stop()
                ticker.cancel()
        result.steps = trainer.step
        result.last = dict(run.last)


def lora_rank(config: RunConfig) -> int | None:
    """The adapter rank vLLM must accept: None without LoRA (at least 16, vLLM's floor)."""
    return max(16, config.trainer.lora.r) if config.trainer.lora.enabled else None


async def _server_pool(cfg: RunConfig, model_path: str, log_dir: Path,
                       stack: contextlib.AsyncExitStack, say: Any) -> Any:  # fmt: skip
    """The servers in inference.servers, or num_servers started here, behind one pool."""
    from agentrl.inference import ServerPool, VLLMServer

    i = cfg.inference
    urls, managed = list(i.servers), {}
    if not urls:
        started = await asyncio.gather(
            *(
                VLLMServer.start(
                    model_path, i, seed=cfg.run.seed, max_lora_rank=lora_rank(cfg), log_dir=log_dir
                )
                for _ in range(i.num_servers)
            ),
            return_exceptions=True,
        )
        for server in started:
            if isinstance(server, VLLMServer):
                stack.push_async_callback(server.stop)
                managed[server.url] = server
        errors = [e for e in started if isinstance(e, BaseException)]
        if errors:
            raise errors[0]
        urls = list(managed)
        say(f"started {len(urls)} vllm serve process(es): {', '.join(urls)}", flush=True)
    return ServerPool(urls, i, managed=managed, health_interval_s=i.health_interval_s,
                      reconnect_timeout_s=i.reconnect_timeout_s,
                      max_restarts=i.max_restarts)  # fmt: skip


def _weights_dir(configured: str) -> Path | None:
    """A folder of our own inside inference.weights_dir (the publisher removes only it)."""
    if not configured:
        return None
    Path(configured).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="agentrl-weights-", dir=configured))


def _eval_line(ev: dict[str, Any]) -> str:
    return (f"eval {ev['label']} (version {ev['version']}, {ev['episodes']} held-out episodes): "
            f"success {ev['success_rate']:.1%}, tool use {ev['tool_use_rate']:.1%}, "
            f"mean reward {ev['reward_mean']:.3f}")  # fmt: skip


def _save_model(trainer: Any, out: Path) -> None:
    """The final weights as a model folder (for a LoRA run: the adapter, with peft's files)."""
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if trainer.is_lora:
        trainer.unwrapped.save_pretrained(tmp)
    else:  # the full weights (under FSDP: gathered at the end of the last step)
        trainer.unwrapped.save_pretrained(tmp, state_dict=trainer.full_state_dict())
    trainer.tokenizer.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)

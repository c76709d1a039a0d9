"""The live state of one ``agentrl train`` process and the run's lines for the user.

* :class:`RunStatus` holds what no component knows (state, evaluations, time spent
  generating) and reads the rest from the components it is handed (trainer, runner,
  queue, loop, server pool): the status snapshot, the per-step metrics row, and the
  ticker that rewrites ``status.json`` and the live display.
* :func:`eval_summary` is the row of one evaluation; :func:`eval_line` its one line.
* :class:`Reporter`: where the run's own lines for the user go (progress on stdout,
  warnings on stderr); the CLI hands one in.

How a status is written and shown (``status.json``, the rich view, ``agentrl top``)
is :mod:`agentrl.monitor`'s. It runs nothing of its own: the run's task group runs
:meth:`RunStatus.ticker`.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.errors import StopRequested
from agentrl.health import HealthWatch, step_signals
from agentrl.monitor import render, write_status

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from agentrl.config import EnvConfig, RunConfig
    from agentrl.inference import ServerPool
    from agentrl.queue import TrajectoryQueue
    from agentrl.rollout.base import Runner
    from agentrl.runtime.metrics import Metrics
    from agentrl.trainer.loop import StepRecord, TrainLoop
    from agentrl.trainer.trainer import Trainer


class RunStatus:
    """The live state of one ``agentrl train`` process.

    It owns what no component knows: the run's state ("starting", "evaluating
    (before)", "training", ...), the evaluations so far, the last step's row and the
    time spent generating. The rest it reads from the components :meth:`attach` hands
    it; until then it reports zeros.

    Args:
        config: the run's config (name, steps, ``eval.success_reward``,
            ``log.status_every_s``).
        run_dir: where ``status.json`` goes.
        metrics: the run's counters (tokens sampled, failures, loop lag).
    """

    def __init__(self, config: RunConfig, run_dir: Path, metrics: Metrics) -> None:
        self.config = config
        self.run_dir = run_dir
        self.metrics = metrics
        self.started = time.perf_counter()
        self.state = "starting"
        self.generation_s = 0.0
        """Seconds with an episode waiting on the engine (sampled every 50 ms)."""
        self.tools = env_offers_tools(config.env)
        """Whether the env gives the model tools (without: tool use is not shown)."""
        self.status: dict[str, Any] = {}
        """The last snapshot taken."""
        self.last: dict[str, Any] = {}
        """The last step's metrics row."""
        self.evals: dict[str, dict[str, Any]] = {}
        """The last evaluation of each label ("before", "during", "after")."""
        self.eval_running: str | None = None
        """The label of an evaluation running beside training (``eval.every``), if any."""
        self.health = HealthWatch(config.health, max_staleness=config.rollout.max_staleness)
        """The health rules over the step rows (``[health]``; docs/guides/health.md)."""
        self._prev_tokens = 0.0
        self._prev_time = time.perf_counter()
        self._trainer: Trainer | None = None
        self._runner: Runner | None = None
        self._eval_runner: Runner | None = None
        self._queue: TrajectoryQueue | None = None
        self._loop: TrainLoop | None = None
        self._pool: ServerPool | None = None
        self._placement: list[Callable[[], list[dict[str, Any]]]] = []

    def attach(
        self,
        *,
        trainer: Trainer,
        runner: Runner,
        queue: TrajectoryQueue,
        loop: TrainLoop,
        pool: ServerPool | None,
    ) -> None:
        """Hand over the components the status reads (``pool``: None without servers)."""
        self._trainer, self._runner, self._queue = trainer, runner, queue
        self._loop, self._pool = loop, pool

    def add_placement(self, rows: Callable[[], list[dict[str, Any]]]) -> None:
        """Add a source of placement rows: ``rows()`` returns one row per piece it placed on
        a Ray cluster (:class:`agentrl.cluster.runtime.Placement`'s ``as_dict()``), read at
        every snapshot."""
        self._placement.append(rows)

    def placement(self) -> list[dict[str, Any]]:
        """Where each piece runs on a Ray cluster (``[cluster]``; empty on one machine):
        every source's rows, inference servers first, then env servers, rollout workers,
        trainer ranks and any other piece, each piece by index."""
        rows = [row for source in self._placement for row in source()]
        return sorted(rows, key=_piece_order)

    def ended(self, error: BaseException) -> None:
        """The run ended with ``error``: state "stopped" when it was asked to stop (a rule
        in ``health.stop_on``), "failed" otherwise."""
        self.state = "stopped" if _asked_to_stop(error) else "failed"

    def evaluating(self, label: str, runner: Runner, *, beside: bool = False) -> None:
        """An evaluation starts; its episodes count as generation time too.

        ``beside``: it runs beside training (``eval.every``), which keeps the run's state.
        """
        if beside:
            self.eval_running = label
        else:
            self.state = f"evaluating ({label})"
        self._eval_runner = runner

    def evaluated(self, summary: dict[str, Any]) -> None:
        """An evaluation ended (``summary["label"]``: "before", "during" or "after")."""
        self.evals[summary["label"]] = summary
        if self.eval_running == summary["label"]:
            self.eval_running = None

    def snapshot(self) -> dict[str, Any]:
        """What ``status.json`` holds: the headline numbers and every in-flight episode."""
        trainer, loop = self._trainer, self._loop
        now = time.monotonic()
        live = []
        if self._runner is not None:
            for p in list(self._runner.live.values()):
                live.append(
                    {
                        "episode": p.episode_id,
                        "env": p.env_id,
                        "turn": p.turn,
                        "phase": p.phase,
                        "started_version": p.started_version,
                        "tokens_by_version": dict(p.tokens_by_version),
                        "tool_calls": p.tool_calls,
                        "age_s": now - p.started_at,
                    }
                )
        counters = self.metrics.counters
        errors = {
            k: int(v)
            for k, v in counters.items()
            if k.startswith(("failures/", "tool_errors/")) and v
        }
        busy = loop.busy if loop is not None else {}
        return {
            "name": self.config.run.name,
            "run_dir": str(self.run_dir),
            "pid": os.getpid(),
            "state": self.state,
            "updated_at": time.time(),
            "tools": self.tools,
            "mode": self.config.train.mode,
            "step": trainer.step if trainer is not None else 0,
            "steps": self.config.train.steps,
            "version": trainer.version if trainer is not None else 0,
            **{
                k: self.last.get(k)
                for k in (
                    "reward_mean",
                    "success_rate",
                    "tool_use_rate",
                    "tokens_per_s",
                    "staleness_mean",
                    "staleness_max",
                )
            },
            "queue_depth": len(self._queue) if self._queue is not None else 0,
            "in_flight": len(live),
            "errors": errors,
            "time": {
                "wall_s": time.perf_counter() - self.started,
                "generation_s": self.generation_s,
                "training_s": busy.get("train_s", 0.0),
                "publish_s": busy.get("publish_s", 0.0),
                "micro_steps": trainer.micro_steps if trainer is not None else {},
            },
            "eval": self.evals,
            "episodes": live,
            "eval_running": self.eval_running
            and {
                "label": self.eval_running,
                "in_flight": len(self._eval_runner.live) if self._eval_runner else 0,
            },
            "servers": self._pool.describe() if self._pool is not None else [],
            "placement": self.placement(),
            "health": [w.as_dict() for w in self.health.recent],
        }

    def write(self, *, episodes: bool = True) -> None:
        """Rewrite ``status.json`` with a new snapshot (``episodes=False``: without the
        in-flight episodes, as a run that ended leaves it)."""
        status = self.snapshot()
        if not episodes:
            status["episodes"] = []
        write_status(self.run_dir, status)

    def refresh(self) -> dict[str, Any]:
        """Take a new snapshot (kept as :attr:`status`) and return it."""
        self.status = self.snapshot()
        return self.status

    async def ticker(self, display: Any) -> None:
        """Sample generation busy time; rewrite status.json; refresh the display.

        Runs until cancelled (a task of the run's task group).
        """
        every = self.config.log.status_every_s
        last_write = 0.0
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.05)
            now = time.perf_counter()
            runners = (self._runner, self._eval_runner)
            if any(p.phase == "engine" for r in runners if r for p in r.live.values()):
                self.generation_s += now - last
            last = now
            if time.perf_counter() - last_write >= every:
                last_write = time.perf_counter()
                await asyncio.to_thread(write_status, self.run_dir, self.refresh())
                if display is not None:
                    display.update(render(self.status, episodes=False))

    def record_step(self, record: StepRecord) -> dict[str, Any]:
        """The metrics row of one optimizer step (kept as :attr:`last`)."""
        s = record.stats
        trajectories = [t for g in record.groups for t in g.trajectories]
        success = self.config.eval.success_reward
        now = time.perf_counter()
        tokens = float(self.metrics.counters.get("tokens_sampled", 0))
        dt = max(now - self._prev_time, 1e-9)
        values = {
            **{k: v for k, v in s.as_dict().items() if k != "step"},
            "success_rate": _mean([t.reward >= success for t in trajectories]),
            "tool_use_rate": _mean(
                [any(sp.kind == "tool" for sp in t.spans) for t in trajectories]
            ),
            "episodes": len(trajectories),
            "tokens_per_s": (tokens - self._prev_tokens) / dt,
            "trained_tokens_per_s": s.tokens / dt,
            "train_s": record.train_s,
            "queue_depth": len(self._queue) if self._queue is not None else 0,
            "in_flight": len(self._runner.live) if self._runner is not None else 0,
            "generation_busy_s": self.generation_s,
            "wall_s": now - self.started,
            "loop_lag_p99_s": self.metrics.percentile("loop_lag_s", 99),
            **step_signals(record.groups),
        }
        if record.publish is not None:
            u = record.publish.update
            values.update(
                publish_s=u.pause_to_resume_s,
                reload_s=u.reload_s,
                episodes_paused=u.episodes_paused,
                tokens_reprefilled=u.tokens_reprefilled,
                tokens_discarded=u.tokens_discarded,
            )
        for k, v in self.metrics.counters.items():
            if k.startswith(("failures/", "tool_errors/")):
                values[f"errors/{k}"] = v
        values.update(self.health.record(s.step, values))
        self._prev_tokens, self._prev_time = tokens, now
        self.last = values
        return values


def env_offers_tools(env: EnvConfig) -> bool:
    """Whether the run's env gives the model tools: one env is made and closed to see
    (as the tool-call check at start does). Env servers, and an env that cannot be made
    here, count as having tools: what is not known is shown."""
    if env.remote:
        return True
    from agentrl.env import make_env

    try:
        made = make_env(env.id, **env.kwargs)
    except Exception as e:  # the run itself reports it, at the env's first episode
        logger.debug("tools of %s not known: %s: %s", env.id, type(e).__name__, e)
        return True
    try:
        return bool(getattr(made.unwrapped, "tools", ()))
    finally:
        made.close()


PIECES = ("inference", "env", "worker", "trainer")
"""The pieces of a run on a Ray cluster, in the order status.json lists them."""


def _piece_order(row: dict[str, Any]) -> tuple[int, int]:
    piece = row.get("piece")
    return PIECES.index(piece) if piece in PIECES else len(PIECES), int(row.get("index") or 0)


def _asked_to_stop(error: BaseException) -> bool:
    if isinstance(error, BaseExceptionGroup):
        return any(_asked_to_stop(e) for e in error.exceptions)
    return isinstance(error, StopRequested)


def _mean(values: list[Any]) -> float:
    return sum(float(v) for v in values) / len(values) if values else float("nan")


class Reporter:
    """Where ``agentrl train`` tells the user what it is doing.

    Progress lines ("run directory: ...", "resumed at step ...") go to stdout,
    warnings to stderr as ``agentrl: warning: ...``. The CLI hands one to
    :func:`agentrl.run.prepare` and :func:`agentrl.run.train`; subclass it to send the
    lines elsewhere (a logger, a notebook).

    Args:
        progress: False drops the progress lines (``log.progress = "none"``), never
            the warnings.
    """

    def __init__(self, *, progress: bool = True) -> None:
        self.progress = progress

    def with_progress(self, progress: bool) -> Reporter:
        """This reporter, with progress lines only if both it and ``progress`` allow."""
        if progress or not self.progress:
            return self
        quiet = copy.copy(self)
        quiet.progress = False
        return quiet

    def say(self, line: str) -> None:
        """A progress line."""
        if self.progress:
            print(line, flush=True)

    def warn(self, line: str) -> None:
        """Something the user should act on; shown whatever ``progress`` says."""
        print(f"agentrl: warning: {line}", file=sys.stderr, flush=True)

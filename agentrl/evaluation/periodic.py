"""Held-out evaluation inside ``agentrl train``: before, every ``eval.every`` steps, after.

* :func:`evaluate` runs ``eval.episodes`` held-out tasks × ``eval.k`` samples under
  the engine's current weights and returns the row of
  :func:`agentrl.evaluation.summary.eval_summary` (success rate, pass@j, avg@k, tool
  use, reward). ``agentrl.run`` calls it before and after training, and
  :class:`PeriodicEval` calls it while training.
* :class:`PeriodicEval` starts one every ``eval.every`` optimizer steps as a task of
  its own task group, so the trainer never waits for it; at most one runs at a time.

How an evaluation beside training shares the engine: its episodes are requests to the
same inference client as the training episodes, up to ``rollout.concurrency`` more at
once, batched by the engine with them. While they run they take slots and compute from
training generation (docs/guides/evaluate.md), and they pass the training runner's
admission gate: a weight update parks them like training episodes, and they continue
under the new weights. So an evaluation started after step N samples with version N
first and may end on a newer one (``version_last`` in its row).
Its episodes go to no store and are never trained on.

Owns no config and writes nothing: the caller records each row (``agentrl.run``: the
metrics log, the status, a line for the user).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from agentrl.evaluation.summary import eval_summary
from agentrl.runtime.metrics import Metrics
from agentrl.runtime.tracing import EVAL, Tracer
from agentrl.status import RunStatus

if TYPE_CHECKING:
    from agentrl.config import RunConfig
    from agentrl.inference import InferenceClient
    from agentrl.types import Group

logger = logging.getLogger(__name__)

DURING = "during"
"""The label of the evaluations run beside training."""


async def evaluate(
    config: RunConfig,
    client: InferenceClient,
    tokenizer: Any,
    label: str,
    version: int,
    *,
    step: int = 0,
    tracer: Tracer | None = None,
    status: RunStatus | None = None,
    admission: asyncio.Event | None = None,
    make: Callable[..., Any] | None = None,
) -> dict[str, Any]:
    """Run ``eval.episodes`` held-out tasks × ``eval.k`` samples under the current weights.

    They go through the same :class:`~agentrl.rollout.Scheduler` as training, one group
    of k per task (at most ``rollout.concurrency`` episodes at once), with no store, no
    staleness bound and no retries; episode ids are ``eval-LABEL-SEED/i``.

    Args:
        label: "before", "during" or "after"; ``step``: the step it starts after.
        version: the policy version the engine holds now.
        status: told when it starts (``during``: beside training) and whose time
            counters its episodes feed.
        admission: the training runner's gate (beside training): a weight update parks
            these episodes too.
        make: builds the envs (the training run's: its env servers with ``[env] url``);
            None: Gymnasium's registry.
    """
    from agentrl.chat.formats import resolve_chat_format
    from agentrl.queue import TrajectoryQueue
    from agentrl.rollout import EpisodeRunner, Scheduler, tasks_for

    ev = config.eval
    rollout = dataclasses.replace(
        config.rollout, temperature=ev.temperature, group_size=ev.k, max_retries=0
    )
    extra = {"make": make} if make is not None else {}
    runner = EpisodeRunner(
        client,
        tokenizer,
        rollout,
        metrics=Metrics(),
        tracer=tracer,
        admission=admission,
        chat=resolve_chat_format(tokenizer, config.model),
        **extra,
    )
    runner.trace_pid = EVAL
    if status is not None:
        status.evaluating(label, runner, beside=label == DURING)
    seeds = tasks_for(config.env.id, ev.episodes, first_seed=ev.first_seed, **config.env.kwargs)
    tasks = [dataclasses.replace(t, task_id=f"eval-{label}-{t.seed}") for t in seeds]
    groups: list[Group] = []
    scheduler = Scheduler(
        runner, TrajectoryQueue(max(len(tasks), 1)), rollout, on_group=groups.append
    )
    t0 = time.perf_counter()
    await scheduler.run(tasks)
    return eval_summary(
        label,
        step,
        version,
        [t for g in groups for t in g.trajectories],
        k=ev.k,
        success_reward=ev.success_reward,
        wall_s=time.perf_counter() - t0,
    )


class PeriodicEval:
    """Starts an evaluation every ``every`` optimizer steps, beside training.

    An async context manager that owns the task group its evaluations run in: leaving
    it waits for the one running; an evaluation that fails fails the run (the group
    cancels the training around it). :meth:`step` is the train loop's per-step hook.
    At most one runs at a time: a step due while one still runs is skipped, with a
    warning, and counted in :attr:`skipped`. The last step (``last_step``) is left to
    the evaluation after training, which scores the same weights on the same tasks.

    Args:
        every: optimizer steps between evaluations (0: none).
        last_step: ``train.steps``.
        launch: runs the evaluation after a step, and records its row.
    """

    def __init__(
        self, every: int, last_step: int, launch: Callable[[int], Awaitable[None]]
    ) -> None:
        self.every = every
        self.last_step = last_step
        self.launch = launch
        self.started: list[int] = []
        """The steps whose evaluation was started, in order."""
        self.skipped: list[int] = []
        """The steps due while the previous evaluation still ran."""
        self._group = asyncio.TaskGroup()
        self._running: asyncio.Task[None] | None = None

    async def __aenter__(self) -> PeriodicEval:
        await self._group.__aenter__()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return await self._group.__aexit__(kind, error, tb)

    def due(self, step: int) -> bool:
        """Whether ``step`` is one to evaluate after."""
        return bool(self.every) and step % self.every == 0 and step < self.last_step

    def step(self, step: int) -> None:
        """After optimizer step ``step``: start its evaluation if it is due and none runs."""
        if not self.due(step):
            return
        if self.running:
            self.skipped.append(step)
            logger.warning(
                "the evaluation due after step %d was skipped: the one started after "
                "step %d still runs (raise eval.every or lower eval.episodes)",
                step,
                self.started[-1],
            )
            return
        self.started.append(step)
        self._running = self._group.create_task(self.launch(step), name=f"eval-step-{step}")

    @property
    def running(self) -> bool:
        return self._running is not None and not self._running.done()

    async def wait(self) -> None:
        """Wait for the evaluation running now, if any (raises what it raised)."""
        if self._running is not None:
            await asyncio.shield(self._running)

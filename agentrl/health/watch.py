"""Running the health rules step by step: once per episode of trouble, and ``stop_on``.

:class:`HealthWatch` takes each step's metrics row (``metrics.jsonl``'s), adds the few
numbers derived across rows (tool errors per tool result, from the cumulative error
counters), runs every rule, and returns the warnings that fired at this step. A rule
that fired stays quiet until ``health.rearm_steps`` steps in a row pass without its
trouble: then it may fire again. The same object replays a finished run's rows
(``agentrl scan``) exactly as it ran during training.

During ``agentrl train`` the run's status (:class:`agentrl.status.RunStatus`) owns one:
its warnings go to the log, the step's row (field ``health``), ``status.json`` (the live
display and ``agentrl top``), and, for a rule named in ``health.stop_on``,
:meth:`HealthWatch.raise_if_stopping` ends the run after the step, resumably.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agentrl.config import HealthConfig
from agentrl.errors import StopRequested
from agentrl.health.rules import History, Rule, default_rules

logger = logging.getLogger(__name__)

TOOL_ERRORS = "errors/tool_errors/"
"""Prefix of the cumulative tool-error counters in a step's row."""


@dataclasses.dataclass(frozen=True, slots=True)
class HealthWarning:
    """One rule firing at one step."""

    rule: str
    step: int
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "step": self.step, "message": self.message}

    def line(self) -> str:
        return f"health: {self.rule} at step {self.step}: {self.message}"


class HealthStop(StopRequested):
    """A rule named in ``health.stop_on`` fired; the run stopped after that step."""


class HealthWatch:
    """The health rules over a run's step rows, each firing once per episode of trouble.

    Args:
        config: the ``[health]`` section (``enabled = false``: nothing ever fires).
        max_staleness: ``rollout.max_staleness`` (the staleness rule's bound).
        rules: the rules to run (default: :func:`~agentrl.health.rules.default_rules`).
    """

    def __init__(
        self,
        config: HealthConfig,
        *,
        max_staleness: int | None = None,
        rules: Iterable[Rule] | None = None,
    ) -> None:
        self.config = config
        self.rules = (
            list(rules) if rules is not None else default_rules(config, max_staleness=max_staleness)
        )
        metrics = dict.fromkeys(itertools.chain.from_iterable(r.metrics for r in self.rules))
        self.history = History(list(metrics))
        self.fired: list[HealthWarning] = []
        """Every warning so far, in order."""
        self.recent: collections.deque[HealthWarning] = collections.deque(maxlen=5)
        self.stopping: list[HealthWarning] = []
        """Warnings of this step whose rule ``stop_on`` names."""
        self._quiet: dict[str, int | None] = {r.name: None for r in self.rules}
        """Per rule: None while armed; else the steps in a row without trouble since it
        fired."""
        self._errors_before: float | None = None

    def observe(self, step: int, row: Mapping[str, Any]) -> list[HealthWarning]:
        """Run the rules on the history plus ``row``; the warnings that fire now."""
        self.stopping = []
        if not self.config.enabled:
            return []
        self.history.append(step, {**row, **self._derived(row)})
        fired = []
        for rule in self.rules:
            message = rule.check(self.history)
            quiet = self._quiet[rule.name]
            if message is not None and quiet is None:
                fired.append(HealthWarning(rule.name, step, message))
                self._quiet[rule.name] = 0
            elif quiet is not None:
                quiet = 0 if message is not None else quiet + 1
                self._quiet[rule.name] = None if quiet >= self.config.rearm_steps else quiet
        for warning in fired:
            logger.warning("%s", warning.line())
        self.fired += fired
        self.recent.extend(fired)
        self.stopping = [w for w in fired if w.rule in self.config.stop_on]
        return fired

    def record(self, step: int, row: Mapping[str, Any]) -> dict[str, Any]:
        """:meth:`observe`, as the fields to add to the step's row (``health``, if any)."""
        fired = self.observe(step, row)
        return {"health": [w.as_dict() for w in fired]} if fired else {}

    def raise_if_stopping(self, run_dir: Path | str) -> None:
        """Raise :class:`HealthStop` if a rule named in ``health.stop_on`` fired at the
        step just observed; its message says what fired and how to go on."""
        if not self.stopping:
            return
        what = "; ".join(f"{w.rule} ({w.message})" for w in self.stopping)
        step = self.stopping[0].step
        raise HealthStop(
            f"health.stop_on: {what} at step {step}. The run stopped after step {step} with a "
            f"checkpoint; continue it with: agentrl train --resume {run_dir} (add "
            f"--health.stop_on=[] to train past the warning), and see the episodes with: "
            f"agentrl scan {run_dir}"
        )

    def _derived(self, row: Mapping[str, Any]) -> dict[str, float]:
        """Tool errors per tool result this step, from the cumulative counters."""
        errors = sum(float(v) for k, v in row.items() if k.startswith(TOOL_ERRORS))
        before, self._errors_before = self._errors_before, errors
        results = row.get("tool_results")
        if before is None or not isinstance(results, int | float) or not results > 0:
            return {}
        return {"tool_error_rate": max(errors - before, 0.0) / float(results)}


def replay_rows(
    rows: Iterable[Mapping[str, Any]], config: HealthConfig, *, max_staleness: int | None = None
) -> list[HealthWarning]:
    """Every warning the rules give over recorded step rows (``metrics.jsonl``'s)."""
    watch = HealthWatch(config, max_staleness=max_staleness)
    for row in rows:
        watch.observe(int(row.get("step", len(watch.history) + 1)), row)
    return watch.fired

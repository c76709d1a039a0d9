"""Run health: warnings while training when learning goes wrong, and the episodes that
show it (``docs/guides/health.md``).

* :mod:`~agentrl.health.rules`: the rules, small pure checks over the per-step metrics;
* :mod:`~agentrl.health.signals`: the step metrics they need that the trainer does not
  compute (entropy, lengths, turns, zero-variance groups, repeated text);
* :mod:`~agentrl.health.watch`: :class:`HealthWatch`, which runs them once per episode
  of trouble during ``agentrl train`` and stops the run for ``health.stop_on``;
* :mod:`~agentrl.health.detectors`: per-episode detectors (and how to write one);
* :mod:`~agentrl.health.scan`: ``agentrl scan RUN``, the rules and detectors over a
  recorded run, read-only.
"""

from __future__ import annotations

from agentrl.health.rules import History, Rule, default_rules
from agentrl.health.signals import step_signals
from agentrl.health.watch import HealthStop, HealthWarning, HealthWatch, replay_rows

__all__ = [
    "HealthStop",
    "HealthWarning",
    "HealthWatch",
    "History",
    "Rule",
    "default_rules",
    "replay_rows",
    "step_signals",
]

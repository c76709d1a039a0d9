"""The seams of ``agentrl.protocols`` declare what their users read: the training loop uses
nothing of its ``RolloutSource`` that the protocol does not declare (``staleness`` included).
Reads the source; ``tests/test_layers.py`` checks the implementations' methods."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import agentrl
from agentrl.protocols import RolloutSource
from agentrl.rollout.scheduler import Scheduler
from tests.inference.test_protocol import members

pytestmark = [pytest.mark.timeout(60)]

PACKAGE = Path(agentrl.__file__).parent


def test_the_training_loop_reads_only_what_rollout_source_declares() -> None:
    tree = ast.parse((PACKAGE / "trainer" / "loop.py").read_text())
    read = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "scheduler"
    }
    assert "staleness" in read, read
    assert read <= set(members(RolloutSource)), read - set(members(RolloutSource))


def test_the_scheduler_has_the_staleness_bound_the_protocol_declares() -> None:
    from agentrl.queue import TrajectoryQueue
    from agentrl.rollout import RolloutConfig
    from agentrl.runtime.metrics import Metrics

    config = RolloutConfig(max_staleness=2)
    scheduler = Scheduler(object(), TrajectoryQueue(4), config, metrics=Metrics())  # type: ignore[arg-type]
    assert scheduler.staleness.max_staleness == 2

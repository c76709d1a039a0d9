"""The ``Runner`` protocol is whole: both runners have every member, and the code that is
handed a runner (scheduler, rollout controller, status view, the run's wiring) uses no
member the protocol does not declare. No engine, no worker process: this reads the
classes and the source."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import agentrl
from agentrl.config import RolloutConfig
from agentrl.rollout.base import Runner
from agentrl.rollout.runner import EpisodeRunner
from agentrl.rollout.workers import WorkerRunner, open_runner
from tests.inference.test_protocol import members, mismatches

pytestmark = [pytest.mark.timeout(60)]

PACKAGE = Path(agentrl.__file__).parent
CALLERS = ("rollout/scheduler.py", "rollout/controller.py", "rollout/job.py", "status.py", "run.py")
"""The modules handed a :class:`Runner` (by ``open_runner`` or a parameter typed ``Runner``)."""
RUNNER_NAMES = {"runner", "_runner", "_eval_runner"}


def _instance(implementation: type) -> object:
    """One built the cheap way (no tokenizer, no worker started)."""
    if implementation is WorkerRunner:
        return WorkerRunner(object(), None, RolloutConfig(workers=2))
    runner = EpisodeRunner(object(), None, chat=object())  # type: ignore[arg-type]
    runner.render_lane.close()
    return runner


def conformance(protocol: type, implementation: type) -> list[str]:
    """The inference clients' check (``mismatches``), where a property of the protocol may
    also be an attribute the implementation sets when it is built."""
    instance = _instance(implementation)
    return [
        wrong
        for wrong in mismatches(protocol, implementation)
        if not (
            wrong.endswith(" is missing")
            and isinstance(members(protocol)[wrong.split(".")[1].split(" ")[0]], property)
            and hasattr(instance, wrong.split(".")[1].split(" ")[0])
        )
    ]


@pytest.mark.parametrize("implementation", [EpisodeRunner, WorkerRunner], ids=lambda c: c.__name__)
def test_both_runners_have_every_member(implementation: type) -> None:
    assert conformance(Runner, implementation) == []


def test_the_conformance_check_fails_for_a_runner_that_lacks_a_member() -> None:
    class Partial(EpisodeRunner):
        drop = None  # type: ignore[assignment]

        def wait_parked(self, episode_ids: set[str]) -> None:  # type: ignore[override]
            pass

    assert conformance(Runner, Partial) == [
        "Partial.drop is missing",
        "Partial.wait_parked: method, but async method in Runner",
    ]


def test_open_runner_is_typed_as_the_protocol() -> None:
    assert inspect.signature(open_runner).return_annotation in ("Runner", Runner)
    assert EpisodeRunner(object(), None, chat=object()).admission.is_set()  # type: ignore[arg-type]


def _is_runner(node: ast.expr) -> bool:
    """``runner``, ``<anything>.runner``, ``self._runner``: how the callers name one."""
    return (isinstance(node, ast.Name) and node.id in RUNNER_NAMES) or (
        isinstance(node, ast.Attribute) and node.attr in RUNNER_NAMES
    )


def used_members(sources: dict[str, str]) -> dict[str, set[str]]:
    """Attributes used on a runner in ``sources`` (file name -> text), with the files."""
    used: dict[str, set[str]] = {}
    for name, text in sources.items():
        for node in ast.walk(ast.parse(text, name)):
            if isinstance(node, ast.Attribute) and _is_runner(node.value):
                used.setdefault(node.attr, set()).add(name)
    return used


def undeclared(sources: dict[str, str]) -> dict[str, list[str]]:
    declared = set(members(Runner))
    used = used_members(sources)
    return {name: sorted(files) for name, files in used.items() if name not in declared}


def test_callers_use_only_declared_members() -> None:
    sources = {f: (PACKAGE / f).read_text() for f in CALLERS}
    used = used_members(sources)
    # the scan sees the callers' uses (a scan that finds nothing proves nothing)
    assert {
        "run",
        "resume",
        "client",
        "metrics",
        "admission",
        "live",
        "parked",
        "snapshot",
        "drop",
        "wait_parked",
    } <= set(used), used
    assert undeclared(sources) == {}, "used on a runner but not declared by Runner"


def test_the_scan_fails_on_a_member_the_protocol_lacks() -> None:
    source = "async def f(self):\n    self.runner.render_lane.close()\n    runner.parked\n"
    assert undeclared({"caller.py": source}) == {"render_lane": ["caller.py"]}

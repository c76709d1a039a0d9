"""Faults injected into single episodes of a real run (fast: a scripted client, no vLLM).

Each test runs the real :class:`EpisodeRunner`, :class:`Scheduler` and
:class:`TrajectoryQueue` over a few tasks in which one task misbehaves (the env, the
model's turns, or the code the model runs in the shipped sandboxed ``python`` tool) and
proves that:

* the faulty episodes end with the right status and a *specific* reason: env exceptions
  and env timeouts fail them (and are retried); the context window, the turn limit and
  the tool-call limit truncate them; tool errors are shown to the model as tool
  messages and counted by kind; sandbox attacks come back as contained text;
* the healthy episodes of the same run, and the episodes after the faulty ones, still
  run and finish;
* every episode is accounted for (:func:`assert_accounted`): each task's group is
  complete, no episode is lost or duplicated, started = finished + truncated + failed,
  and no request or episode is left in flight.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import os
import re
import threading
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

import envs  # noqa: F401  (registers the shipped envs now, not inside a timed env call)
from agentrl.env import AsyncTextEnv, TextEnv, parse_final_answer, register_env
from agentrl.errors import ContextOverflowError
from agentrl.inference.base import Generation, SamplingConfig
from agentrl.queue import TrajectoryQueue
from agentrl.rollout import EpisodeRunner, RolloutConfig, Scheduler, tasks_for
from agentrl.types import Group, Task, Trajectory
from envs.python_puzzle import PythonPuzzleEnv
from tests.rollout.fakes import ScriptedClient
from tools import python_sandbox

BAD_SEED = 1
"""Of the tasks with seeds 0, 1 and 2, the one whose episodes meet the fault."""
GROUP_SIZE = 2
HUGE_OBS = "lorem ipsum " * 100
"""About 900 tokens: more than the scripted client's 512-token window."""
LONG_OBS = "lorem ipsum " * 30
"""About 270 tokens: fits the advertised window, not the short engine's."""

_RELEASE = threading.Event()
"""Set at the end of a test to let its hung env steps (worker threads) return."""
_CLOSED: list[str] = []
"""Env ids of closed FaultEnvs (list.append is atomic across worker threads)."""
_STUCK: list[int] = []
"""Seeds of env steps now hung in their worker thread."""


# --- envs --------------------------------------------------------------------------------


class FaultEnv(TextEnv):
    """Two turns, then done; the episodes of task ``BAD_SEED`` meet ``fault``.

    Args:
        fault: ``none``, ``reset_raises``, ``step_raises``, ``step_hangs``,
            ``reset_huge_obs``, ``step_huge_obs``, ``step_long_obs``, ``reset_bad_obs``,
            ``step_bad_obs`` or ``close_hangs``.
        bad_obs: what the ``*_bad_obs`` faults return as the observation.
    """

    def __init__(self, fault: str = "none", bad_obs: Any = None) -> None:
        self.fault, self.bad_obs = fault, bad_obs
        self.turns, self.bad = 0, False

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.turns, self.bad = 0, seed == BAD_SEED
        fault = self.fault if self.bad else "none"
        if fault == "reset_raises":
            raise RuntimeError("reset exploded")
        if fault == "reset_huge_obs":
            return HUGE_OBS, {}
        if fault == "reset_bad_obs":
            return self.bad_obs, {}
        return f"Task {seed}: say something, twice.", {}

    def step(self, action: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self.turns += 1
        fault = self.fault if self.bad else "none"
        if fault == "step_raises":
            raise ValueError("step exploded")
        if fault == "step_hangs":
            _STUCK.append(BAD_SEED)
            _RELEASE.wait(timeout=30)  # blocks its worker thread, as a stuck env would
        if fault == "step_huge_obs":
            return HUGE_OBS, 0.0, False, False, {}
        if fault == "step_long_obs":
            return LONG_OBS, 0.0, False, False, {}
        if fault == "step_bad_obs":
            return self.bad_obs, 0.0, False, False, {}
        done = self.turns >= 2
        return "Once more.", 1.0, done, False, ({"reason": "spoke twice"} if done else {})

    def close(self) -> None:
        if self.bad and self.fault == "close_hangs":
            _RELEASE.wait(timeout=30)
        _CLOSED.append("tests/Fault-v0")


class HangingAsyncEnv(AsyncTextEnv):
    """Async twin of FaultEnv: ``astep`` of task ``BAD_SEED`` never returns."""

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        await super().areset(seed=seed)
        self.turns, self.bad = 0, seed == BAD_SEED
        return f"Task {seed}: say something, twice.", {}

    async def astep(self, action: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self.turns += 1
        if self.bad:
            await asyncio.Event().wait()  # forever (until cancelled)
        done = self.turns >= 2
        return "Once more.", 1.0, done, False, ({"reason": "spoke twice"} if done else {})

    def close(self) -> None:
        _CLOSED.append("tests/FaultAsync-v0")


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


class ToolEnv(TextEnv):
    """What is 1 + 2? Ends on the first turn with ``Answer: N``; has an ``add`` tool."""

    tools = (add,)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        return f"Task {seed}: what is 1 + 2? Reply 'Answer: N'.", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        answer = parse_final_answer(action)
        if answer is None:
            return "Reply with 'Answer: N'.", 0.0, False, False, {}
        right = answer == 3
        return "", float(right), True, False, {"reason": "right" if right else "wrong answer"}


register_env("tests/Fault-v0", FaultEnv)
register_env("tests/FaultAsync-v0", HangingAsyncEnv)
register_env("tests/Tool-v0", ToolEnv)


# --- running and accounting --------------------------------------------------------------


@dataclasses.dataclass
class Run:
    """What one scheduler run left behind."""

    groups: list[Group]
    scheduler: Scheduler
    runner: EpisodeRunner
    client: ScriptedClient

    @property
    def counters(self) -> Any:
        return self.runner.metrics.counters

    @property
    def final(self) -> list[Trajectory]:
        return [t for g in self.groups for t in g.trajectories]

    def of_seed(self, seed: int) -> list[Trajectory]:
        return [t for t in self.final if t.seed == seed]

    def tool_messages(self, traj: Trajectory) -> list[str]:
        return [m["content"] for m in traj.messages if m["role"] == "tool"]

    def tool_errors(self) -> dict[str, int]:
        return {k: v for k, v in self.counters.items() if k.startswith("tool_errors/") and v}


async def run_tasks(
    client: ScriptedClient,
    config: RolloutConfig,
    tasks: Iterable[Task] | Callable[[EpisodeRunner], AsyncIterable[Task]],
    *,
    group_size: int = GROUP_SIZE,
    concurrency: int = 16,
    max_retries: int = 0,
) -> Run:
    """Run ``tasks`` (or ``tasks(runner)``) through a scheduler; return every queued group."""
    runner = EpisodeRunner(client, client.tokenizer, config)
    queue = TrajectoryQueue(1000)
    scheduler = Scheduler(
        runner,
        queue,
        RolloutConfig(concurrency=concurrency, group_size=group_size, max_retries=max_retries),
    )
    await scheduler.run(tasks(runner) if callable(tasks) else tasks)
    groups = [await queue.get() for _ in range(len(queue))]
    return Run(groups, scheduler, runner, client)


def assert_accounted(run: Run, tasks: int, group_size: int = GROUP_SIZE) -> None:
    """Every task's group is complete and every episode and request is accounted for."""
    m = run.counters
    final_ids = [t.episode_id for t in run.final]
    if _RECORD:  # the fault table: measured before asserting
        record, name = _RECORD[-1]
        complete = sum(g.complete for g in run.groups)
        record(
            f"episode fault: {name}",
            injected=1,
            survived=int(complete == tasks),
            lost=max(tasks * group_size - len(set(final_ids)), 0),
            trained_twice=len(final_ids) - len(set(final_ids)),
        )
    assert len(run.groups) == len({g.task.task_id for g in run.groups}) == tasks
    for group in run.groups:
        assert group.complete and group.size == group_size, group.task
        for t in group.trajectories:
            assert t.task_id == group.task.task_id
            assert t.status in ("finished", "truncated", "failed")
            assert t.reason.strip(), f"{t.episode_id} ended {t.status} with no reason"
    final = run.final
    assert len(final) == tasks * group_size
    ids = [t.episode_id for t in final]
    assert len(set(ids)) == len(ids), f"an episode appears twice: {sorted(ids)}"
    attempts = final + run.scheduler.failed_attempts
    assert all(t.status == "failed" and t.reason for t in run.scheduler.failed_attempts)
    assert m["episodes_started"] == len(attempts) == tasks * group_size + m["episode_retries"]
    assert m["episodes_started"] == (
        m["episodes_finished"] + m["episodes_truncated"] + m["episodes_failed"]
    )
    for status in ("finished", "truncated", "failed"):
        assert m[f"episodes_{status}"] == sum(t.status == status for t in attempts), status
    assert m["groups_done"] == tasks
    assert not run.client.in_flight and not run.runner.live and not run.runner.parked
    assert run.scheduler.in_flight == 0


def decoded(tokenizer: Any, prompt_ids: Sequence[int]) -> tuple[str, int]:
    """The prompt as text, and how many assistant turns it already holds."""
    text = tokenizer.decode(list(prompt_ids))
    return text, text.count("<|im_start|>assistant") - 1


def seed_of(text: str) -> int:
    found = re.search(r"Task (\d+):", text)
    assert found, "the prompt lost the env's first observation"
    return int(found.group(1))


_RECORD: list[tuple[Any, str]] = []


@pytest.fixture(autouse=True)
def _fault_row(record_fault: Any, request: pytest.FixtureRequest) -> Iterable[None]:
    name = request.node.name.removeprefix("test_").replace("_", " ")
    _RECORD.append((record_fault, name))
    yield
    _RECORD.clear()


@pytest.fixture(autouse=True)
def _fresh_env_state() -> Iterable[None]:
    _RELEASE.clear()
    _CLOSED.clear()
    _STUCK.clear()
    yield
    _RELEASE.set()


# --- 1. env faults ------------------------------------------------------------------------

CONTEXT_FULL = (
    "context window full (512 tokens): raise inference.max_model_len "
    "(agentrl rollout --max-model-len N)"
)
STEP_HANGS = "env_timeout: step took longer than 0.5 s (rollout.env_timeout_s)"
ENV_FAULTS = [
    pytest.param(
        "tests/Fault-v0",
        "reset_raises",
        "failed",
        "env_exception: reset raised RuntimeError: reset exploded",
        id="reset-raises",
    ),
    pytest.param(
        "tests/Fault-v0",
        "step_raises",
        "failed",
        "env_exception: step raised ValueError: step exploded",
        id="step-raises",
    ),
    pytest.param("tests/Fault-v0", "step_hangs", "failed", STEP_HANGS, id="sync-step-hangs"),
    pytest.param("tests/FaultAsync-v0", "none", "failed", STEP_HANGS, id="async-step-hangs"),
    pytest.param(
        "tests/Fault-v0", "reset_huge_obs", "truncated", CONTEXT_FULL, id="reset-obs-beyond-context"
    ),
    pytest.param(
        "tests/Fault-v0", "step_huge_obs", "truncated", CONTEXT_FULL, id="step-obs-beyond-context"
    ),
]


@pytest.mark.parametrize(("env_id", "fault", "status", "reason"), ENV_FAULTS)
async def test_env_faults_end_only_their_episodes(
    tokenizer: Any, env_id: str, fault: str, status: str, reason: str
) -> None:
    client = ScriptedClient(tokenizer, lambda p: "Hello.", max_model_len=512)
    hangs = reason.startswith("env_timeout")
    config = RolloutConfig(max_turns=4, env_timeout_s=0.5 if hangs else 10.0)
    kwargs = {"fault": fault} if env_id == "tests/Fault-v0" else {}
    try:
        run = await run_tasks(client, config, tasks_for(env_id, 3, **kwargs), max_retries=1)
    finally:
        _RELEASE.set()
    assert_accounted(run, 3)
    m = run.counters

    bad = run.of_seed(BAD_SEED)
    assert [(t.status, t.reason) for t in bad] == [(status, reason)] * GROUP_SIZE
    if status == "failed":  # retried once with a fresh env, then recorded as failed
        assert [t.attempt for t in bad] == [1] * GROUP_SIZE
        retried = run.scheduler.failed_attempts
        assert [(t.seed, t.attempt, t.reason) for t in retried] == [(1, 0, reason)] * GROUP_SIZE
        kind = bad[0].failure  # the typed kind; the reason spells it for people
        assert kind is not None and reason.startswith(f"{kind}: ")
        assert {t.failure for t in [*bad, *retried]} == {kind}
        assert m["episodes_failed"] == m[f"failures/{kind}"] == 2 * GROUP_SIZE
        assert not any(t.trainable for t in bad)
    else:
        assert m["episode_retries"] == 0
    if fault == "reset_huge_obs":  # recorded as it came, never sampled on, not trainable
        assert all(t.num_sampled == 0 and not t.trainable for t in bad)
    if fault == "step_huge_obs":  # the observation was not appended
        assert all(len(t) < client.max_model_len and HUGE_OBS not in str(t.messages) for t in bad)
    if fault in ("reset_raises", "reset_huge_obs"):  # the model was never asked
        assert not any(c[1].request_id.startswith(bad[0].task_id) for c in client.calls)
    if fault == "reset_raises":
        assert all(len(t) == 0 and t.messages == [] for t in bad)
    if fault in ("step_raises", "step_hangs", "step_huge_obs") or env_id != "tests/Fault-v0":
        assert all(t.num_sampled > 0 and t.env_log[0]["obs"] for t in bad)  # kept the turn

    for seed in (0, 2):  # the run went on: the other tasks ran as if nothing happened
        assert [(t.status, t.reason, t.reward) for t in run.of_seed(seed)] == [
            ("finished", "spoke twice", 2.0)
        ] * GROUP_SIZE
    # every env built was closed, failed or not (and those the replay checks built)
    assert len(_CLOSED) == m["episodes_started"] + m.get("replay_checks", 0)


BAD_OBSERVATIONS = [
    pytest.param("step_bad_obs", 42, id="step-returns-int"),
    pytest.param("step_bad_obs", {"text": "hi"}, id="step-returns-dict"),
    pytest.param("step_bad_obs", [1, 2], id="step-returns-list-of-ints"),
    pytest.param("reset_bad_obs", [{"content": "no role"}], id="reset-returns-roleless-message"),
]


@pytest.mark.parametrize(("fault", "bad_obs"), BAD_OBSERVATIONS)
async def test_an_observation_of_the_wrong_type_fails_the_episode_naming_the_env(
    tokenizer: Any, fault: str, bad_obs: Any
) -> None:
    client = ScriptedClient(tokenizer, lambda p: "Hello.", max_model_len=512)
    tasks = tasks_for("tests/Fault-v0", 3, fault=fault, bad_obs=bad_obs)
    run = await run_tasks(client, RolloutConfig(max_turns=4), tasks)
    assert_accounted(run, 3)
    for t in run.of_seed(BAD_SEED):
        assert t.status == "failed"
        assert "tests/Fault-v0" in t.reason, t.reason  # which env misbehaved
        assert type(bad_obs).__name__ in t.reason, t.reason  # what it returned
        assert "expected" in t.reason and "str" in t.reason, t.reason  # what it should have
    for seed in (0, 2):
        assert {t.status for t in run.of_seed(seed)} == {"finished"}


class ShortEngineClient(ScriptedClient):
    """Advertises a 4096-token window, but its engine refuses prompts of 200 tokens or more.

    A ``vllm serve`` started with a smaller ``--max-model-len`` than the run was configured
    with answers exactly so: HTTP 400, which the server client turns into
    :class:`ContextOverflowError` (inference/server.py ``_request_error``).
    """

    engine_limit = 200

    async def generate(
        self, prompt_token_ids: Sequence[int], sampling: SamplingConfig, request_id: str
    ) -> Generation:
        if len(prompt_token_ids) >= self.engine_limit:
            raise ContextOverflowError(len(prompt_token_ids), self.engine_limit)
        return await super().generate(prompt_token_ids, sampling, request_id)


async def test_a_context_overflow_from_the_engine_truncates_the_episode(tokenizer: Any) -> None:
    client = ShortEngineClient(tokenizer, lambda p: "Hello.", max_model_len=4096)
    tasks = tasks_for("tests/Fault-v0", 3, fault="step_long_obs")
    run = await run_tasks(client, RolloutConfig(max_turns=4), tasks)
    assert_accounted(run, 3)
    for t in run.of_seed(BAD_SEED):
        actions = [e["action"] for e in t.env_log[1:]]
        assert actions == ["Hello."], f"the env was stepped with made-up actions: {actions}"
        assert t.status == "truncated" and "context" in t.reason, (t.status, t.reason)
    for seed in (0, 2):
        assert {t.status for t in run.of_seed(seed)} == {"finished"}


async def test_hung_env_steps_do_not_starve_the_rest_of_the_run(tokenizer: Any) -> None:
    workers = min(32, (os.cpu_count() or 1) + 4)  # ThreadPoolExecutor's default (3.8-3.12)
    timeout_s = 0.5
    hung = [
        Task(f"hang#{i}", "tests/Fault-v0", BAD_SEED, env_kwargs={"fault": "step_hangs"})
        for i in range(workers)
    ]
    healthy = list(tasks_for("tests/Fault-v0", 2, first_seed=2))

    def tasks(runner: EpisodeRunner) -> AsyncIterator[Task]:
        async def gen() -> AsyncIterator[Task]:
            for task in hung:
                yield task
            while len(_STUCK) < workers:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            await asyncio.sleep(timeout_s + 0.3)  # every hung step has timed out by now
            for task in healthy:  # later in the run
                yield task
            ended = ("episodes_finished", "episodes_truncated", "episodes_failed")
            async with asyncio.timeout(10):  # then let the hung threads return
                while sum(runner.metrics.counters[k] for k in ended) < len(healthy):  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            _RELEASE.set()

        return gen()

    client = ScriptedClient(tokenizer, lambda p: "Hello.", max_model_len=512)
    try:
        run = await run_tasks(
            client,
            RolloutConfig(max_turns=4, env_timeout_s=timeout_s),
            tasks,
            group_size=1,
            concurrency=workers + 2,
        )
    finally:
        _RELEASE.set()
    assert_accounted(run, workers + 2, group_size=1)
    assert {t.reason for t in run.final if t.seed == BAD_SEED} == {
        f"env_timeout: step took longer than {timeout_s} s (rollout.env_timeout_s)"
    }
    later = [(t.status, t.reason) for t in run.final if t.seed != BAD_SEED]
    assert later == [("finished", "spoke twice")] * 2


async def test_an_env_close_that_hangs_does_not_hold_the_run(tokenizer: Any) -> None:
    client = ScriptedClient(tokenizer, lambda p: "Hello.", max_model_len=512)
    config = RolloutConfig(max_turns=4, env_timeout_s=0.5)
    try:
        async with asyncio.timeout(3):  # the run needs well under a second
            run = await run_tasks(
                client, config, tasks_for("tests/Fault-v0", 3, fault="close_hangs")
            )
    finally:
        _RELEASE.set()
    assert_accounted(run, 3)
    for t in run.of_seed(BAD_SEED):  # the episode itself went fine; its close did not
        assert (t.status, t.reason) == ("finished", "spoke twice")
        assert "close_error" in t.info and "0.5 s" in t.info["close_error"], t.info
    assert run.counters["env_close_errors"] == GROUP_SIZE


# --- 2. model faults ----------------------------------------------------------------------

ADD_CALL = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
LONG_TEXT = "Let me think step by step. " * 10  # about 150 tokens
CUT_CALL = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2, "note": "' + "x" * 400
GOOD_RESULT = "<tool_response>\n3\n</tool_response>"
MAX_TOKENS = 48


@dataclasses.dataclass(frozen=True)
class ModelFault:
    """What the model does in task BAD_SEED, and how its episodes must end."""

    reply: str
    always: bool
    """Reply so on every turn; else only on the first, then call add and answer right."""
    status: str
    reason: str
    tool_error: str | None = None
    shown: str | None = None
    """Text the model must see in a tool message after the faulty turn."""


MODEL_FAULTS = {
    "malformed-json": ModelFault(
        '<tool_call>{"name": "add", "arguments": {broken</tool_call>',
        False,
        "finished",
        "right",
        "malformed_json",
        "Error: tool call is not valid JSON",
    ),
    "not-an-object": ModelFault(
        '<tool_call>["add", 1, 2]</tool_call>',
        False,
        "finished",
        "right",
        "malformed_json",
        'Error: a tool call must be {"name": string, "arguments": object}',
    ),
    "unknown-tool": ModelFault(
        '<tool_call>{"name": "rm_rf", "arguments": {"path": "/"}}</tool_call>',
        False,
        "finished",
        "right",
        "unknown_tool",
        "Error: unknown tool 'rm_rf'; available tools: ['add']",
    ),
    "bad-arguments": ModelFault(
        '<tool_call>{"name": "add", "arguments": {"a": "one", "b": 2}}</tool_call>',
        False,
        "finished",
        "right",
        "bad_arguments",
        "Error: argument 'a' must be integer, got str 'one'",
    ),
    "call-cut-off-by-length": ModelFault(
        CUT_CALL,
        False,
        "finished",
        "right",
        "cut_off",
        "Error: the tool call was cut off before </tool_call>",
    ),
    "endless-tool-calls": ModelFault(ADD_CALL, True, "truncated", "tool-call limit (3)"),
    "empty-turns": ModelFault("", True, "truncated", "turn limit (4) reached"),
    "turns-hit-length-limit": ModelFault(LONG_TEXT, True, "truncated", "turn limit (4) reached"),
}


@pytest.mark.parametrize("name", list(MODEL_FAULTS))
async def test_model_faults_are_shown_to_the_model_counted_and_limited(
    tokenizer: Any, name: str
) -> None:
    fault = MODEL_FAULTS[name]

    def model(prompt_ids: Sequence[int]) -> str:
        text, turn = decoded(tokenizer, prompt_ids)
        if seed_of(text) == BAD_SEED and (fault.always or turn == 0):
            return fault.reply
        return "Answer: 3" if GOOD_RESULT in text else ADD_CALL

    client = ScriptedClient(tokenizer, model, max_model_len=2048)
    config = RolloutConfig(
        max_turns=4, max_tool_calls=3, max_tokens_per_turn=MAX_TOKENS, tool_timeout_s=1.0
    )
    run = await run_tasks(client, config, tasks_for("tests/Tool-v0", 3))
    assert_accounted(run, 3)

    bad = run.of_seed(BAD_SEED)
    assert [(t.status, t.reason) for t in bad] == [(fault.status, fault.reason)] * GROUP_SIZE
    for t in bad:
        tool_messages = run.tool_messages(t)
        if fault.shown is not None:  # the error, then the good call's result
            assert len(tool_messages) == 2 and tool_messages[1] == "3", tool_messages
            assert tool_messages[0].startswith(fault.shown), tool_messages[0]
    expected_errors = {f"tool_errors/{fault.tool_error}": GROUP_SIZE} if fault.tool_error else {}
    assert run.tool_errors() == expected_errors

    gens = {g.request_id: g for _, g in client.calls if g.request_id.startswith(bad[0].task_id)}
    if name == "endless-tool-calls":  # 3 calls ran, the 4th hit the limit unrun
        assert all(run.tool_messages(t) == ["3"] * 3 for t in bad)
        assert all([e["tool"] for e in t.env_log[1:]] == ["add"] * 3 for t in bad)
        assert all("action" not in e for t in bad for e in t.env_log)  # never stepped
    if name == "empty-turns":  # each turn is just the end-of-turn token, and the env saw ""
        assert all(g.token_ids == (client.eot,) for g in gens.values())
        assert all([e["action"] for e in t.env_log[1:]] == [""] * 4 for t in bad)
        assert all(
            [m["content"] for m in t.messages if m["role"] == "assistant"] == [""] * 4 for t in bad
        )
    if name == "turns-hit-length-limit":  # every turn cut at the limit, no end-of-turn token
        assert len(gens) == 4 * GROUP_SIZE
        assert all(
            g.finish_reason == "length"
            and len(g.token_ids) == MAX_TOKENS
            and client.eot not in g.token_ids
            for g in gens.values()
        )
        for t in bad:
            spans = [s for s in t.spans if s.kind == "assistant"]
            assert [s.end - s.start for s in spans] == [MAX_TOKENS] * 4
            actions = [e["action"] for e in t.env_log[1:]]
            assert len(actions) == 4 and all(LONG_TEXT.startswith(a) for a in actions)
    if name == "call-cut-off-by-length":
        first = [g for g in gens.values() if g.finish_reason == "length"]
        assert len(first) == GROUP_SIZE

    for seed in (0, 2):  # the healthy tasks: one good call, then the right answer
        for t in run.of_seed(seed):
            assert (t.status, t.reason, t.reward) == ("finished", "right", 1.0)
            assert run.tool_messages(t) == ["3"]


async def test_tool_errors_of_episodes_that_then_fail_are_counted(tokenizer: Any) -> None:
    malformed = MODEL_FAULTS["malformed-json"].reply

    def model(prompt_ids: Sequence[int]) -> str:
        return malformed if decoded(tokenizer, prompt_ids)[1] == 0 else "Hello."

    client = ScriptedClient(tokenizer, model, max_model_len=1024)
    tasks = tasks_for("tests/Fault-v0", 3, fault="step_raises")
    run = await run_tasks(client, RolloutConfig(max_turns=4), tasks)
    assert_accounted(run, 3)
    assert {t.status for t in run.of_seed(BAD_SEED)} == {"failed"}
    for t in run.final:  # every episode made one malformed call, and was told so
        assert run.tool_messages(t)[0].startswith("Error: tool call is not valid JSON")
    assert run.tool_errors() == {"tool_errors/malformed_json": 3 * GROUP_SIZE}


# --- 3. the sandboxed python tool inside a run --------------------------------------------


def _attacks(escape_target: Path) -> dict[str, str]:
    return {
        "fork_bomb": "import os\nwhile True:\n    os.fork()",
        "memory_hog": "x = bytearray(4 * 1024**3)\nprint('allocated')",
        "infinite_loop": "while True:\n    pass",
        "read_secret": (
            "import os\nprint('secret:', os.environ.get('AGENTRL_TEST_SECRET'))\n"
            "print(open(f'/proc/{os.getppid()}/environ', 'rb').read())"
        ),
        "write_outside": f"open({str(escape_target)!r}, 'w').write('escaped')",
        "huge_output": "print('x' * 100_000_000)",
        "benign": "print(6 * 7)",  # last: the run goes on after every attack
    }


async def test_sandbox_attacks_inside_a_run_are_contained_and_the_run_goes_on(
    tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The shipped tool, with its limits cut down so the test stays fast.
    limits = functools.partial(
        python_sandbox.SandboxLimits, wall_s=3.0, cpu_s=1, max_output_bytes=4096
    )
    monkeypatch.setattr(python_sandbox, "SandboxLimits", limits)
    monkeypatch.setenv("AGENTRL_TEST_SECRET", "hunter2")
    target = tmp_path / "escaped.txt"
    attacks = _attacks(target)
    names = list(attacks)
    question = {PythonPuzzleEnv().reset(seed=s)[0]: names[s] for s in range(len(names))}
    assert len(question) == len(names)  # each seed asks its own question

    def model(prompt_ids: Sequence[int]) -> str:
        text, _ = decoded(tokenizer, prompt_ids)
        if "<tool_response>" in text:
            return "Answer: 0"
        (attack,) = [name for q, name in question.items() if q in text]
        call = {"name": "python", "arguments": {"code": attacks[attack]}}
        return f"<tool_call>{json.dumps(call)}</tool_call>"

    client = ScriptedClient(tokenizer, model, max_model_len=16384)
    config = RolloutConfig(max_turns=4, max_tokens_per_turn=1024, tool_timeout_s=8.0)
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    run = await run_tasks(
        client, config, tasks_for("agentrl/PythonPuzzle-v0", len(names)), concurrency=GROUP_SIZE
    )  # one task after the other
    assert_accounted(run, len(names))

    outputs: dict[str, list[str]] = {}
    for seed, name in enumerate(names):
        episodes = run.of_seed(seed)
        assert [(t.status, t.reason) for t in episodes] == [
            ("finished", "wrong answer")
        ] * GROUP_SIZE
        outputs[name] = [c for t in episodes for c in run.tool_messages(t)]
        assert len(outputs[name]) == GROUP_SIZE, (name, outputs[name])
    for out in outputs["fork_bomb"]:
        assert "PermissionError: sandbox: os.fork is not allowed" in out, out
    for out in outputs["memory_hog"]:
        assert "MemoryError" in out and "allocated" not in out, out
    for out in outputs["infinite_loop"]:  # CPU limit (SIGXCPU/SIGKILL) or the wall clock
        assert out.startswith("Error: killed"), out
    for out in outputs["read_secret"]:
        assert "secret: None" in out, out
        assert "sandbox: reading other processes is not allowed" in out, out
    for out in outputs["write_outside"]:
        assert "PermissionError: sandbox: writing outside the working directory" in out, out
    for out in outputs["huge_output"]:
        assert out.endswith("(output truncated)") and len(out) <= 4096 + 20, out[-100:]
    assert outputs["benign"] == ["42"] * GROUP_SIZE

    assert not target.exists()
    everything = json.dumps([t.messages for t in run.final])
    assert "hunter2" not in everything  # the secret reached no message, tool output or not
    assert run.tool_errors() == {}  # every attack came back as text, none as a tool failure
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= children

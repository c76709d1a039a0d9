"""``EpisodeRunner``: one episode from ``reset(seed)`` to its end, in tokens.

The loop: render the prompt; generate until the end of the turn; if the turn holds
tool calls (or broken ones), run the tools with their timeouts and append the results
as tool messages; otherwise step the env with the turn's text and append its
observation; repeat until the env terminates or truncates, or a turn, tool-call or
context limit is hit.

What ends an episode, and how it is recorded:

* ``finished``: the env terminated;
* ``truncated``: the env truncated, or the turn limit, the tool-call limit or the
  context window was reached (``reason`` says which);
* ``failed``: the env raised (in ``reset`` or ``step``), timed out, or returned
  something that is not an observation; ``failure`` holds the
  :class:`~agentrl.types.FailureKind` and ``reason`` the exception, in words.

Engine failures are not episode failures: they raise :class:`InfraError` and stop the
run. Sync envs and tools run in worker threads; only the event loop coordinates.

Pausing and resuming: before each generation call the runner passes the admission
gate; while a weight update holds it closed, the episode is *parked* (its state is
readable through :meth:`EpisodeRunner.snapshot`, :meth:`~EpisodeRunner.oldest_version`
and :meth:`~EpisodeRunner.prefix_tokens`). An aborted generation hands back
its tokens, and the runner continues from the exact prefix once the gate opens. At
every turn boundary the episode is offered to ``checkpoint`` as a
:class:`~agentrl.types.PartialEpisode`; :meth:`EpisodeRunner.resume` continues one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from agentrl import faults
from agentrl.chat import Conversation, as_messages
from agentrl.config import RolloutConfig
from agentrl.env import EnvHandle, make_env, supports_state
from agentrl.errors import ContextOverflowError, InfraError
from agentrl.inference.base import InferenceClient, SamplingConfig
from agentrl.metrics import Metrics
from agentrl.rollout.verify import verify_log
from agentrl.tools import ToolCall, ToolResult, ToolSet
from agentrl.trace import ROLLOUT, EpisodeTrace, Tracer
from agentrl.types import (
    EpisodeStatus,
    FailureKind,
    PartialEpisode,
    RequestId,
    Task,
    Timings,
    Trajectory,
)

logger = logging.getLogger(__name__)

_request_ids = itertools.count()


def sampling(config: RolloutConfig, max_tokens: int) -> SamplingConfig:
    """The sampling parameters of one assistant turn under ``config``."""
    return SamplingConfig(max_tokens=max_tokens, temperature=config.temperature,
                          top_p=config.top_p, ignore_eos=config.ignore_eos)  # fmt: skip


@dataclasses.dataclass(slots=True)
class EpisodeProgress:
    """Live state of a running episode, for progress views."""

    episode_id: str
    env_id: str
    turn: int = 0
    phase: str = "env"
    """What it waits on now: engine, tool, env, or paused (held for a weight update)."""
    started_version: int = 0
    sampled: int = 0
    started_at: float = dataclasses.field(default_factory=time.monotonic)
    tokens_by_version: dict[int, int] = dataclasses.field(default_factory=dict)
    """Sampled tokens per policy version, so far."""
    tool_calls: int = 0
    trace: Any = dataclasses.field(default=None, repr=False)
    """An :class:`~agentrl.trace.EpisodeTrace` when the runner traces."""

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        if self.trace is not None:
            self.trace.enter(phase)

    def add_tokens(self, versions: Sequence[int]) -> None:
        self.sampled += len(versions)
        for v in versions:
            self.tokens_by_version[int(v)] = self.tokens_by_version.get(int(v), 0) + 1


class EnvFailure(Exception):
    """The env raised or misbehaved; the episode fails with this kind and reason.

    Its text (the trajectory's ``reason``) is ``"<kind>: <detail>"``.
    """

    def __init__(self, kind: FailureKind, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


class EpisodeDropped(Exception):
    """A weight update discarded this unfinished episode (``drop`` policy); run it again."""

    def __init__(self, episode_id: str, reason: str, tokens_discarded: int) -> None:
        super().__init__(f"episode {episode_id!r} dropped: {reason}")
        self.reason = reason
        self.tokens_discarded = tokens_discarded


@dataclasses.dataclass(slots=True)
class _Episode:
    """Everything one running episode holds; what a checkpoint saves."""

    task: Task
    episode_id: str
    attempt: int
    started_version: int
    progress: EpisodeProgress
    timings: Timings = dataclasses.field(default_factory=Timings)
    rewards: list[float] = dataclasses.field(default_factory=list)
    env_log: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    turn_starts: list[dict[str, int]] = dataclasses.field(default_factory=list)
    tool_calls: int = 0
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    handle: EnvHandle | None = None
    toolset: ToolSet | None = None
    conversation: Conversation | None = None
    pending: list[int] = dataclasses.field(default_factory=list)
    """Tokens sampled so far in the current, unfinished assistant turn."""
    drop_reason: str | None = None


class EpisodeRunner:
    """Runs episodes against one inference client.

    Args:
        client: the inference engine.
        tokenizer: the model's tokenizer (chat template included).
        config: limits and sampling.
        metrics: where counts and timings go.
        make: builds an env from an id and keyword arguments (default: Gymnasium).
        admission: awaited before every generation call; a weight update closes it to
            hold new requests back (see :class:`~agentrl.rollout.controller.RolloutController`).
        checkpoint: called with a :class:`PartialEpisode` at every turn boundary (the
            store writer batches them); None: no per-turn checkpoints.
    """

    def __init__(
        self,
        client: InferenceClient,
        tokenizer: Any,
        config: RolloutConfig | None = None,
        *,
        metrics: Metrics | None = None,
        make: Callable[..., Any] = make_env,
        admission: asyncio.Event | None = None,
        checkpoint: Callable[[PartialEpisode], Any] | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        self.client = client
        self.tracer = tracer
        self.trace_pid = ROLLOUT
        """The trace track its episodes go to (evaluation uses its own)."""
        self.tokenizer = tokenizer
        self.config = config or RolloutConfig()
        self.metrics = metrics or Metrics()
        self.make = make
        self.admission = admission
        self.checkpoint = checkpoint
        self.live: dict[str, EpisodeProgress] = {}
        self._replay_checks: dict[str, int] = {}
        self._replay_warned: set[str] = set()
        self._parked: dict[str, _Episode] = {}
        self._parked_changed = asyncio.Condition()
        # Chat-template rendering and tokenization (a few ms each) run in one worker
        # thread: on the loop, a vLLM batch finishing hundreds of turns at once would
        # stall it for a second. One thread: the tokenizer is not safe to share.
        self._render_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="render"
        )

    async def _render(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._render_pool, fn, *args)

    async def run(self, task: Task, episode_id: str, attempt: int = 0) -> list[Trajectory]:
        """Run one episode; return its trajectory (several if the template re-segmented).

        Raises:
            EpisodeDropped: a weight update in ``drop`` mode discarded it.
        """
        ep = self._new(task, episode_id, attempt, self.client.version)
        return await self._execute(ep, None)

    async def resume(self, partial: PartialEpisode) -> list[Trajectory]:
        """Continue a checkpointed episode from its exact token prefix.

        The env is rebuilt from the seed and restored with ``set_state`` when the
        checkpoint holds its state, or by replaying the recorded actions; a replay
        that does not reproduce the recorded observations fails the episode (the env
        is not deterministic from its seed).
        """
        ep = self._new(partial.task, partial.episode_id, partial.attempt, partial.started_version)
        return await self._execute(ep, partial)

    def _new(self, task: Task, episode_id: str, attempt: int, version: int) -> _Episode:
        progress = EpisodeProgress(episode_id, task.env_id, started_version=version)
        return _Episode(task, episode_id, attempt, version, progress)

    @property
    def parked(self) -> tuple[str, ...]:
        """The ids of the episodes held at the admission gate (paused), in parking order."""
        return tuple(self._parked)

    def snapshot(self, episode_id: str) -> PartialEpisode:
        """A checkpoint of a parked episode (see :attr:`parked`)."""
        return self._snapshot(self._parked[episode_id])

    def oldest_version(self, episode_id: str) -> int | None:
        """The policy version of a parked episode's oldest sampled token (None: none yet)."""
        conv = self._parked[episode_id].conversation
        if conv is None:
            return None
        versions = [
            int(v)
            for seg in conv.segments
            for v, m in zip(seg.versions, seg.loss_mask, strict=True)
            if m
        ]
        return min(versions) if versions else None

    def prefix_tokens(self, episode_id: str) -> int:
        """The tokens a parked episode re-submits when it resumes (its whole prefix)."""
        return len(self._parked[episode_id].conversation or ())

    def drop(self, episode_id: str, reason: str) -> int:
        """Discard a parked episode when it is released; return its sampled tokens."""
        ep = self._parked[episode_id]
        ep.drop_reason = reason
        return _sampled_tokens(ep)

    async def wait_parked(self, episode_ids: set[str]) -> None:
        """Wait until each of these episodes is parked at the gate or has ended."""
        async with self._parked_changed:
            await self._parked_changed.wait_for(
                lambda: all(e in self._parked or e not in self.live for e in episode_ids)
            )

    async def _notify_parked(self) -> None:
        async with self._parked_changed:
            self._parked_changed.notify_all()

    async def _execute(self, ep: _Episode, partial: PartialEpisode | None) -> list[Trajectory]:
        if ep.episode_id in self.live:
            raise ValueError(f"episode {ep.episode_id!r} is already running")
        self.live[ep.episode_id] = ep.progress
        if self.tracer is not None and self.tracer.enabled:
            ep.progress.trace = EpisodeTrace(self.tracer, ep.episode_id, self.trace_pid)
            ep.progress.set_phase(ep.progress.phase)
        self.metrics.count("episodes_resumed" if partial else "episodes_started")
        try:
            trajectories = await self._drive(ep, partial)
            if trajectories[0].status != "failed":
                await self._check_replayable(ep, trajectories)
            return trajectories
        finally:
            if ep.progress.trace is not None:
                ep.progress.trace.end()
            del self.live[ep.episode_id]
            self._parked.pop(ep.episode_id, None)
            await self._notify_parked()

    async def _check_replayable(self, ep: _Episode, trajectories: list[Trajectory]) -> None:
        """Replay the first episodes of each env from their seed; record and warn (once per
        env) when one does not replay: resume-by-replay and ``replay --verify`` would fail
        on its episodes (an env drawing from the process-wide ``random``, for example)."""
        env_id = ep.task.env_id
        done = self._replay_checks.get(env_id, 0)
        if done >= REPLAY_CHECKS or len(ep.env_log) < 2:
            return
        self._replay_checks[env_id] = done + 1
        make = functools.partial(self.make, env_id, **ep.task.env_kwargs)
        try:
            async with asyncio.timeout(self.config.env_timeout_s):
                env = await asyncio.to_thread(make)
                result = await asyncio.to_thread(verify_log, env, ep.task, ep.env_log)
            difference = result.difference
        except Exception as e:  # a replay that raises does not replay either
            difference = f"replaying raised {type(e).__name__}: {e}"
        if difference is None:
            return
        self.metrics.count("episodes_not_replayable")
        for t in trajectories:
            t.info["not_replayable"] = difference
        if env_id not in self._replay_warned:
            self._replay_warned.add(env_id)
            logger.warning(
                "episode %s of %s does not replay from its seed (%s); its episodes cannot be "
                "resumed by replay or checked with `agentrl replay --verify`. The env likely "
                "draws from process-wide state such as the `random` module: `agentrl "
                "check-env %s` shows it; draw from self.np_random instead",
                ep.episode_id, env_id, difference, env_id,
            )  # fmt: skip

    async def _drive(self, ep: _Episode, partial: PartialEpisode | None) -> list[Trajectory]:
        cfg = self.config
        t_start = time.perf_counter() - ep.timings.total_s
        status: EpisodeStatus = "truncated"
        reason = f"turn limit ({cfg.max_turns}) reached"
        failure: FailureKind | None = None
        try:
            if partial is None:
                await self._start(ep)
            else:
                await self._restore(ep, partial)
            conversation, toolset = ep.conversation, ep.toolset
            assert conversation is not None and toolset is not None
            max_len = self.client.max_model_len
            while conversation.turn < cfg.max_turns:
                ep.progress.turn = conversation.turn
                if not ep.pending:
                    if len(conversation) >= max_len:
                        status, reason = "truncated", _context_full(max_len)
                        break
                    ep.turn_starts.append(self._turn_start(ep))
                text, finish = await self._sample(ep)
                if finish == "length" and len(conversation) >= max_len:
                    status, reason = "truncated", _context_full(max_len)
                    break
                parsed = toolset.parse(text)
                if parsed.has_tool_activity:
                    ep.tool_calls += len(parsed.calls) + len(parsed.errors)
                    ep.progress.tool_calls = ep.tool_calls
                    if ep.tool_calls > cfg.max_tool_calls:
                        status, reason = "truncated", f"tool-call limit ({cfg.max_tool_calls})"
                        break
                    ep.progress.set_phase("tool")
                    t0 = time.perf_counter()
                    results = [await toolset.call(c) for c in parsed.calls] + list(parsed.errors)
                    ep.timings.tools_s += time.perf_counter() - t0
                    for call, result in zip(parsed.calls, results, strict=False):
                        if result.error not in _TOOL_NEVER_RAN:
                            ep.env_log.append(self._logged(ep, _log_tool(call, result)))
                    ep.rewards.append(0.0)
                    tool_messages = [
                        {"role": "tool", "name": r.name, "content": r.content} for r in results
                    ]
                    if not await self._render(conversation.add_messages, tool_messages, "tool",
                                              max_len):  # fmt: skip
                        status, reason = "truncated", _context_full(max_len)
                        break
                    self._checkpoint(ep, t_start)
                    continue
                ep.progress.set_phase("env")
                obs, reward, terminated, truncated, info = await self._env_call(
                    ep.timings, "step", _checked_step, ep.handle, text, ep.task.env_id
                )
                ep.info = info
                ep.rewards.append(float(reward))
                ep.env_log.append(
                    self._logged(ep, _log_step(text, obs, reward, terminated, truncated))
                )
                if terminated or truncated:
                    status = "finished" if terminated else "truncated"
                    reason = str(
                        info.get("reason", "env terminated" if terminated else "env truncated")
                    )
                    break
                if not await self._render(conversation.add_messages, as_messages(obs), "env",
                                          max_len):  # fmt: skip
                    status, reason = "truncated", _context_full(max_len)
                    break
                self._checkpoint(ep, t_start)
        except EnvFailure as e:
            status, reason, failure = "failed", str(e), e.kind
        except _ContextFull as e:
            status, reason = "truncated", str(e)
        finally:
            if ep.toolset is not None:
                for kind, n in ep.toolset.errors.items():
                    self.metrics.count(f"tool_errors/{kind}", n)
            if ep.handle is not None:
                await self._close(ep)
        ep.timings.total_s = time.perf_counter() - t_start
        self.metrics.count(f"episodes_{status}")
        conversation = ep.conversation
        if failure is not None:
            self.metrics.count(f"failures/{failure}")
        if conversation is None:  # failed before the first render: an empty record
            return [self._trajectory(ep, None, 0, status, reason, failure)]
        self.metrics.count("template_new_segments", conversation.segments_started)
        return [
            self._trajectory(ep, conversation, i, status, reason, failure)
            for i in range(len(conversation.segments))
        ]

    async def _close(self, ep: _Episode) -> None:
        """Close the env under the env deadline; a failing close must not lose the episode."""
        assert ep.handle is not None
        error = None
        try:
            async with asyncio.timeout(self.config.env_timeout_s):
                await ep.handle.close()
        except TimeoutError:
            error = f"close took longer than {self.config.env_timeout_s} s"
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
        finally:
            ep.handle.abandon()
        if error is not None:
            self.metrics.count("env_close_errors")
            ep.info = {**ep.info, "close_error": error}

    async def _start(self, ep: _Episode) -> None:
        task = ep.task
        ep.handle = await self._env_call(ep.timings, "make", self._build, task)
        obs, ep.info = await self._env_call(
            ep.timings, "reset", _checked_reset, ep.handle, task.seed, task.options, task.env_id
        )
        ep.toolset = ToolSet(ep.handle.tools, timeout_s=self.config.tool_timeout_s)
        messages = as_messages(obs)
        ep.env_log.append(self._logged(ep, {"obs": messages}))
        if ep.handle.system_prompt and (not messages or messages[0]["role"] != "system"):
            messages = [{"role": "system", "content": ep.handle.system_prompt}, *messages]
        tools = ep.toolset.schemas or None
        ep.conversation = await self._render(
            functools.partial(Conversation, self.tokenizer, messages, tools=tools)
        )

    async def _restore(self, ep: _Episode, p: PartialEpisode) -> None:
        task = ep.task
        ep.timings = dataclasses.replace(p.timings)
        ep.handle = await self._env_call(ep.timings, "make", self._build, task)
        obs, ep.info = await self._env_call(
            ep.timings, "reset", _checked_reset, ep.handle, task.seed, task.options, task.env_id
        )
        ep.toolset = ToolSet(ep.handle.tools, timeout_s=self.config.tool_timeout_s)
        steps = sum("action" in e for e in p.env_log[1:])
        if p.env_state is not None and supports_state(ep.handle.env):
            await self._env_call(ep.timings, "set_state", ep.handle.set_state, p.env_state, steps)
        else:
            expected = p.env_log[0].get("obs") if p.env_log else None
            if expected is not None and as_messages(obs) != expected:
                raise EnvFailure(
                    FailureKind.ENV_REPLAY,
                    "reset(seed) gave a different first observation than the "
                    "recorded one; the env is not deterministic from its seed (give it "
                    "get_state/set_state to make it resumable)",
                )
            await self._replay_log(ep, p.env_log)
        ep.conversation = Conversation.restore(self.tokenizer, p)
        if p.tools is None:  # a fork built from a trajectory: the env declares them
            ep.conversation.tools = ep.toolset.schemas or None
        ep.rewards = list(p.rewards)
        ep.env_log = [dict(e) for e in p.env_log]
        ep.turn_starts = [dict(t) for t in p.turn_starts]
        ep.tool_calls = p.tool_calls
        ep.info = dict(p.info)
        if p.turn_sampled:
            ep.pending = list(ep.conversation.token_ids[-p.turn_sampled :])
        ep.progress.tool_calls = p.tool_calls
        for seg in ep.conversation.segments:
            ep.progress.add_tokens(
                [v for v, m in zip(seg.versions, seg.loss_mask, strict=True) if m]
            )

    async def _replay_log(self, ep: _Episode, log: list[dict[str, Any]]) -> None:
        """Bring a fresh env to where ``log`` left it: its env steps and tool calls, in order.

        Raises:
            EnvFailure: a replayed step or tool call gave something else than recorded
                (the env is not deterministic from its seed and actions).
        """
        assert ep.handle is not None and ep.toolset is not None
        for i, entry in enumerate(log[1:], start=1):
            if "tool" in entry:
                result = await ep.toolset.call(ToolCall(entry["tool"], entry["arguments"]))
                same, what = result.content == entry["result"], f"tool call {entry['tool']}"
            else:
                obs, *_rest = await self._env_call(
                    ep.timings, "replay step", _checked_step, ep.handle, entry["action"]
                )
                same, what = as_messages(obs) == entry["obs"], "step"
            if not same:
                raise EnvFailure(
                    FailureKind.ENV_REPLAY,
                    f"replaying entry {i} ({what}) gave a different result than the recorded "
                    "one; the env is not deterministic from its seed and actions (give it "
                    "get_state/set_state to make it resumable)",
                )

    def _logged(self, ep: _Episode, entry: dict[str, Any]) -> dict[str, Any]:
        """``entry`` with the env's state after it, when the env has ``get_state``: forks
        and verification then start from the env exactly as it was, tool effects included."""
        assert ep.handle is not None
        try:
            state = ep.handle.get_state()
        except Exception as e:  # a get_state that raises: forks replay the log instead
            self.metrics.count("checkpoint_errors")
            ep.info = {**ep.info, "checkpoint_error": f"{type(e).__name__}: {e}"}
            state = None
        if state is not None:
            entry["state"] = state
        return entry

    def _turn_start(self, ep: _Episode) -> dict[str, int]:
        conv = ep.conversation
        assert conv is not None
        return {
            "messages": len(conv.messages),
            "segment": len(conv.segments) - 1,
            "tokens": len(conv),
            "env_steps": len(ep.env_log) - 1,
            "rewards": len(ep.rewards),
            "tool_calls": ep.tool_calls,
        }

    def _snapshot(self, ep: _Episode) -> PartialEpisode:
        conv = ep.conversation
        handle = ep.handle
        assert conv is not None and handle is not None
        return PartialEpisode(
            episode_id=ep.episode_id,
            task=ep.task,
            attempt=ep.attempt,
            version=self.client.version,
            started_version=ep.started_version,
            segments=[s.arrays() for s in conv.segments],
            messages=[dict(m) for m in conv.messages],
            tools=conv.tools,
            turn=conv.turn,
            turn_sampled=len(ep.pending),
            last_finish=conv.last_finish,
            segments_started=conv.segments_started,
            rewards=list(ep.rewards),
            tool_calls=ep.tool_calls,
            env_state=_current_state(ep.env_log, handle),
            env_log=[dict(e) for e in ep.env_log],
            turn_starts=[dict(t) for t in ep.turn_starts],
            timings=dataclasses.replace(ep.timings),
            info=_jsonable(ep.info),
        )

    def _checkpoint(self, ep: _Episode, t_start: float) -> None:
        if self.checkpoint is None:
            return
        ep.timings.total_s = time.perf_counter() - t_start
        try:
            snapshot = self._snapshot(ep)
        except Exception as e:  # an env whose get_state raises: resume will replay
            self.metrics.count("checkpoint_errors")
            ep.info = {**ep.info, "checkpoint_error": f"{type(e).__name__}: {e}"}
            return
        self.checkpoint(snapshot)

    async def _build(self, task: Task) -> EnvHandle:
        executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="agentrl-env")
        make = functools.partial(self.make, task.env_id, **task.env_kwargs)
        try:
            env = await asyncio.get_running_loop().run_in_executor(executor, make)
        except BaseException:
            executor.shutdown(wait=False, cancel_futures=True)
            raise
        return EnvHandle(env, executor)

    async def _env_call(
        self, timings: Timings, name: str, fn: Callable[..., Any], *args: Any
    ) -> Any:
        """Await an env call under the env deadline; its failures fail the episode."""
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(self.config.env_timeout_s):
                return await fn(*args)
        except TimeoutError:
            raise EnvFailure(
                FailureKind.ENV_TIMEOUT, f"{name} took longer than {self.config.env_timeout_s} s"
            ) from None
        except (InfraError, EnvFailure, asyncio.CancelledError):
            raise
        except Exception as e:
            raise EnvFailure(
                FailureKind.ENV_EXCEPTION, f"{name} raised {type(e).__name__}: {e}"
            ) from e
        finally:
            timings.env_s += time.perf_counter() - t0

    async def _park(self, ep: _Episode) -> None:
        """Wait at the closed admission gate (a weight update is running)."""
        assert self.admission is not None
        progress = ep.progress
        phase = progress.phase
        progress.set_phase("paused")
        self._parked[ep.episode_id] = ep
        await self._notify_parked()
        t0 = time.perf_counter()
        try:
            await self.admission.wait()
        finally:
            ep.timings.engine_wait_s += time.perf_counter() - t0
            self._parked.pop(ep.episode_id, None)
            progress.set_phase(phase)
        if ep.drop_reason is not None:
            raise EpisodeDropped(ep.episode_id, ep.drop_reason, _sampled_tokens(ep))

    async def _sample(self, ep: _Episode) -> tuple[str, str]:
        """Generate one assistant turn; continue after aborts from the exact prefix."""
        conversation = ep.conversation
        assert conversation is not None
        budget = self.config.max_tokens_per_turn
        sampled = ep.pending
        overflow: ContextOverflowError | None = None
        ep.progress.set_phase("engine")
        while True:
            if self.admission is not None and not self.admission.is_set():
                await self._park(ep)
            room = self.client.max_model_len - len(conversation)
            max_tokens = min(budget - len(sampled), room)
            if max_tokens < 1:
                finish = "length"
                break
            t0 = time.perf_counter()
            try:
                gen = await self.client.generate(
                    conversation.token_ids,
                    sampling(self.config, max_tokens),
                    RequestId(ep.episode_id, next(_request_ids)).format(),
                )
            except ContextOverflowError as e:
                # The engine's window is smaller than the one advertised: end the turn
                # with what was sampled, then the episode (nothing was made up).
                overflow = e
                finish = "length"
                break
            except (InfraError, asyncio.CancelledError):
                raise
            except Exception as e:
                raise InfraError(
                    f"the inference engine failed: {type(e).__name__}: {e}; the run stops here "
                    "(groups already completed were handed on and are kept)"
                ) from e
            finally:
                ep.timings.generate_s += time.perf_counter() - t0
            faults.point("generation")
            conversation.add_sampled(gen.token_ids, gen.logprobs, gen.versions)
            sampled.extend(gen.token_ids)
            ep.progress.add_tokens(gen.versions)
            self.metrics.count("tokens_sampled", len(gen.token_ids))
            if gen.finish_reason != "abort":
                finish = gen.finish_reason
                break
            self.metrics.count("generations_resumed")
        conversation.end_assistant_turn(conversation.decode(sampled), finish)
        ep.pending = []
        if overflow is not None:
            limit = self.client.max_model_len
            raise _ContextFull(f"{_context_full(limit)} (the engine refused it: {overflow})")
        return conversation.messages[-1]["content"], finish

    def _trajectory(
        self,
        ep: _Episode,
        conversation: Conversation | None,
        index: int,
        status: EpisodeStatus,
        reason: str,
        failure: FailureKind | None,
    ) -> Trajectory:
        if conversation is None:
            arrays: dict[str, Any] = dict(token_ids=[], logprobs=[], versions=[], loss_mask=[],
                                          spans=())  # fmt: skip
            messages: list[dict[str, Any]] = []
        else:
            seg = conversation.segments[index]
            arrays = dict(token_ids=seg.token_ids, logprobs=seg.logprobs, versions=seg.versions,
                          loss_mask=seg.loss_mask, spans=tuple(seg.spans))  # fmt: skip
            messages = conversation.messages
        return Trajectory(
            episode_id=ep.episode_id,
            task_id=ep.task.task_id,
            env_id=ep.task.env_id,
            seed=ep.task.seed,
            messages=messages,
            turn_rewards=list(ep.rewards),
            reward=float(sum(ep.rewards)),
            status=status,
            reason=reason,
            failure=failure,
            segment=index,
            attempt=ep.attempt,
            timings=ep.timings,
            info=_jsonable(ep.info),
            env_log=ep.env_log,
            turn_starts=ep.turn_starts,
            **arrays,
        )


def _sampled_tokens(ep: _Episode) -> int:
    conv = ep.conversation
    return sum(sum(s.loss_mask) for s in conv.segments) if conv is not None else 0


def _context_full(max_len: int) -> str:
    """The truncation reason when the conversation outgrows the context window."""
    return (f"context window full ({max_len} tokens): raise inference.max_model_len "
            "(agentrl rollout --max-model-len N)")  # fmt: skip


def _current_state(log: list[dict[str, Any]], handle: EnvHandle) -> dict[str, Any] | None:
    """The env's state now: the snapshot logged with the last entry, else a fresh one."""
    if log and "state" in log[-1]:
        return log[-1]["state"]
    return handle.get_state()


REPLAY_CHECKS = 2
"""Episodes of each env id replayed from their seed after they end (see
``EpisodeRunner._check_replayable``)."""

_TOOL_NEVER_RAN = ("unknown_tool", "bad_arguments")
"""Tool errors where the tool function was never called (nothing to replay)."""


def _log_tool(call: ToolCall, result: ToolResult) -> dict[str, Any]:
    return {"tool": call.name, "arguments": dict(call.arguments), "result": result.content}


def _log_step(
    action: str, obs: Any, reward: float, terminated: bool, truncated: bool
) -> dict[str, Any]:
    return {"action": action, "obs": as_messages(obs), "reward": reward,
            "terminated": terminated, "truncated": truncated}  # fmt: skip


class _ContextFull(Exception):
    """The engine refused the prompt as too long: the episode ends truncated."""


_ROLES = ("system", "user", "assistant", "tool")


def _check_observation(obs: Any, env_id: str, where: str) -> None:
    """Refuse an observation the chat template cannot take, naming the env."""
    if obs is None or isinstance(obs, str):
        return
    problem = None
    if not isinstance(obs, list):
        problem = f"a {type(obs).__name__}"
    else:
        for i, m in enumerate(obs):
            if not isinstance(m, dict):
                problem = f"a list whose item {i} is a {type(m).__name__}"
            elif m.get("role") not in _ROLES:
                problem = f"a list whose message {i} has role {m.get('role')!r}"
            elif not isinstance(m.get("content"), str):
                problem = (f"a list whose message {i} has content of type "
                           f"{type(m.get('content')).__name__}")  # fmt: skip
            if problem:
                break
    if problem:
        raise EnvFailure(
            FailureKind.ENV_BAD_OBSERVATION,
            f"{env_id} {where} returned {problem} ({obs!r:.120}); "
            f"expected a str, or a list of {{'role': one of {list(_ROLES)}, 'content': str}} "
            "messages",
        )


async def _checked_reset(
    handle: EnvHandle, seed: int | None, options: dict[str, Any] | None, env_id: str = "the env"
) -> tuple[Any, dict[str, Any]]:
    obs, info = await handle.reset(seed=seed, options=options)
    _check_observation(obs, env_id, "reset()")
    return obs, dict(info or {})


async def _checked_step(
    handle: EnvHandle, text: str, env_id: str = "the env"
) -> tuple[Any, float, bool, bool, dict[str, Any]]:
    obs, reward, terminated, truncated, info = await handle.step(text)
    _check_observation(obs, env_id, "step()")
    return obs, float(reward), bool(terminated), bool(truncated), dict(info or {})


def _jsonable(info: dict[str, Any]) -> dict[str, Any]:
    """Keep the env's info only as far as it is plain JSON data."""
    import json

    out = {}
    for key, value in info.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            value = repr(value)
        out[str(key)] = value
    return out

"""``EpisodeRunner``: one episode from ``reset(seed)`` to its end, in tokens.

The loop: render the prompt; generate until the end of the turn; split off the turn's
thinking (the model's :class:`~agentrl.chat.formats.ChatFormat`); if the answer holds
tool calls in the model family's format (or broken ones), run the tools with their
timeouts and append the results the way the family's template shows them; otherwise
step the env with the answer and append its observation; repeat until the env
terminates or truncates, or a turn, tool-call or context limit is hit.

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
turn boundaries (its first, then at most once per ``rollout.checkpoint_interval_s``) the
episode is offered to ``checkpoint`` as a
:class:`~agentrl.types.PartialEpisode`; :meth:`EpisodeRunner.resume` continues one.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

from agentrl.chat import as_messages
from agentrl.chat.formats import ChatFormat, resolve_chat_format
from agentrl.config import RolloutConfig
from agentrl.env import make_env
from agentrl.errors import ContextOverflowError, InfraError, RemoteEnvError
from agentrl.inference.base import InferenceClient
from agentrl.rollout.envside import (
    TOOL_NEVER_RAN,
    ContextFull,
    EnvCalls,
    checked_step,
    context_full,
    log_step,
    log_tool,
    remote_failure,
    sampled_tokens,
)
from agentrl.rollout.episode import (
    EnvFailure,
    EpisodeDropped,
    EpisodeProgress,
    EpisodeState,
    sampling,
)
from agentrl.rollout.records import oldest_sampled_version, snapshot_of, trajectory_of, turn_start
from agentrl.rollout.turnstile import Turnstile
from agentrl.runtime import faults
from agentrl.runtime.metrics import Metrics
from agentrl.runtime.threads import Deadlines, ThreadLane
from agentrl.runtime.tracing import ROLLOUT, EpisodeTrace, Tracer
from agentrl.tools import ParsedTurn
from agentrl.types import (
    EpisodeStatus,
    FailureKind,
    PartialEpisode,
    RequestId,
    Task,
    Trajectory,
)

logger = logging.getLogger(__name__)

_request_ids = itertools.count()


def _open_gate() -> asyncio.Event:
    gate = asyncio.Event()
    gate.set()
    return gate


class EpisodeRunner(EnvCalls):
    """Runs episodes against one inference client.

    Args:
        client: the inference engine.
        tokenizer: the model's tokenizer (chat template included).
        config: limits and sampling.
        metrics: where counts and timings go.
        make: builds an env from an id and keyword arguments (default: Gymnasium).
        admission: awaited before every generation call; a weight update closes it to
            hold new requests back (see :class:`~agentrl.rollout.controller.RolloutController`).
            None: a gate of its own, open.
        checkpoint: called with a :class:`PartialEpisode` at turn boundaries (the first,
            then at most once per ``rollout.checkpoint_interval_s``; the store writer
            batches them); None: no per-turn checkpoints.
        chat: how turns are read (tool-call format, reasoning); None: detected from
            the tokenizer's chat template (:func:`~agentrl.chat.formats.resolve_chat_format`).
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
        chat: ChatFormat | None = None,
    ) -> None:
        self.client = client
        self.chat = chat if chat is not None else resolve_chat_format(tokenizer)
        self.tracer = tracer
        self.trace_pid = ROLLOUT
        """The trace track its episodes go to (evaluation uses its own)."""
        self.tokenizer = tokenizer
        self.config = config or RolloutConfig()
        self.env_deadlines = Deadlines(self.config.env_timeout_s)
        self.metrics = metrics or Metrics()
        self.make = make
        self.admission = admission if admission is not None else _open_gate()
        self.checkpoint = checkpoint
        self.live: dict[str, EpisodeProgress] = {}
        self._replay_checks: dict[str, int] = {}
        self._replay_warned: set[str] = set()
        self._parked: dict[str, EpisodeState] = {}
        self._parked_changed = asyncio.Condition()
        # Chat-template rendering and tokenization (a few ms each) run in one worker
        # thread: on the loop, a vLLM batch finishing hundreds of turns at once would
        # stall it for a second. One thread: the tokenizer is not safe to share.
        self.render_lane = ThreadLane("render")
        # An engine step that ends hundreds of turns wakes hundreds of episodes at once;
        # they go on a slice per loop pass, so timers and weight updates are not held up.
        self._turnstile = Turnstile()

    async def _render(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await self.render_lane.call(fn, *args)

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

    def _new(self, task: Task, episode_id: str, attempt: int, version: int) -> EpisodeState:
        progress = EpisodeProgress(episode_id, task.env_id, started_version=version)
        return EpisodeState(task, episode_id, attempt, version, progress)

    @property
    def parked(self) -> tuple[str, ...]:
        """The ids of the episodes held at the admission gate (paused), in parking order."""
        return tuple(self._parked)

    def snapshot(self, episode_id: str) -> PartialEpisode:
        """A checkpoint of a parked episode (see :attr:`parked`)."""
        return self._snapshot(self._parked[episode_id])

    def oldest_version(self, episode_id: str) -> int | None:
        """The policy version of a parked episode's oldest sampled token (None: none yet)."""
        return oldest_sampled_version(self._parked[episode_id].conversation)

    def prefix_tokens(self, episode_id: str) -> int:
        """The tokens a parked episode re-submits when it resumes (its whole prefix)."""
        return len(self._parked[episode_id].conversation or ())

    def drop(self, episode_id: str, reason: str) -> int:
        """Discard a parked episode when it is released; return its sampled tokens."""
        ep = self._parked[episode_id]
        ep.drop_reason = reason
        return sampled_tokens(ep)

    async def wait_parked(self, episode_ids: set[str]) -> None:
        """Wait until each of these episodes is parked at the gate or has ended."""
        async with self._parked_changed:
            await self._parked_changed.wait_for(
                lambda: all(e in self._parked or e not in self.live for e in episode_ids)
            )

    async def _notify_parked(self) -> None:
        async with self._parked_changed:
            self._parked_changed.notify_all()

    async def _execute(self, ep: EpisodeState, partial: PartialEpisode | None) -> list[Trajectory]:
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

    async def _drive(self, ep: EpisodeState, partial: PartialEpisode | None) -> list[Trajectory]:
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
                        status, reason = "truncated", context_full(max_len)
                        break
                    start = turn_start(ep)
                    # Once per turn: a checkpoint taken at the admission gate, before
                    # the turn's first token, already holds this turn's start.
                    if not ep.turn_starts or ep.turn_starts[-1] != start:
                        ep.turn_starts.append(start)
                text, finish = await self._sample(ep)
                if finish == "length" and len(conversation) >= max_len:
                    status, reason = "truncated", context_full(max_len)
                    break
                answer = self.chat.answer(text)
                parsed = self.chat.parse(toolset, answer, finish, conversation.turn - 1)
                if parsed.has_tool_activity:
                    ended = await self._tool_turn(ep, parsed, max_len)
                else:
                    ended = await self._env_turn(ep, answer, max_len)
                if ended is not None:
                    status, reason = ended
                    break
                if conversation.turn < cfg.max_turns:  # else it ends now: the end supersedes
                    self._checkpoint(ep, t_start)
        except EnvFailure as e:
            status, reason, failure = "failed", str(e), e.kind
        except ContextFull as e:
            status, reason = "truncated", str(e)
        finally:
            if ep.toolset is not None:
                for kind, n in ep.toolset.errors.items():
                    self.metrics.count(f"tool_errors/{kind}", n)
            if ep.handle is not None:
                await self._close(ep)
        ep.timings.total_s = time.perf_counter() - t_start
        return self._finish(ep, status, reason, failure)

    async def _tool_turn(
        self, ep: EpisodeState, parsed: ParsedTurn, max_len: int
    ) -> tuple[EpisodeStatus, str] | None:
        """Run a turn's tool calls and append their results; how the episode ended, if."""
        assert ep.toolset is not None and ep.conversation is not None
        limit = self.config.max_tool_calls
        ep.tool_calls += len(parsed.calls) + len(parsed.errors)
        ep.progress.tool_calls = ep.tool_calls
        if ep.tool_calls > limit:
            return "truncated", f"tool-call limit ({limit})"
        ep.progress.set_phase("tool")
        t0 = time.perf_counter()
        results = [await ep.toolset.call(c) for c in parsed.calls] + list(parsed.errors)
        ep.timings.tools_s += time.perf_counter() - t0
        if ep.handle is not None:  # a remote env whose server went away during the calls
            try:
                ep.handle.raise_if_lost()
            except RemoteEnvError as e:
                raise remote_failure(e) from e
        for call, result in zip(parsed.calls, results, strict=False):
            if result.error not in TOOL_NEVER_RAN:
                ep.env_log.append(self._logged(ep, log_tool(call, result)))
        ep.rewards.append(0.0)
        messages = self.chat.tool_results(ep.conversation, parsed, results)
        add = functools.partial(ep.conversation.add_messages, keep_sampled=self.chat.keep_thinking)
        if not await self._render(add, messages, "tool", max_len):
            return "truncated", context_full(max_len)
        return None

    async def _env_turn(
        self, ep: EpisodeState, text: str, max_len: int
    ) -> tuple[EpisodeStatus, str] | None:
        """Step the env with the turn's text and append its reply; how it ended, if."""
        assert ep.conversation is not None
        ep.progress.set_phase("env")
        obs, reward, terminated, truncated, info = await self._env_call(
            ep.timings, "step", checked_step, ep.handle, text, ep.task.env_id
        )
        ep.info = info
        ep.rewards.append(float(reward))
        ep.env_log.append(self._logged(ep, log_step(text, obs, reward, terminated, truncated)))
        if terminated or truncated:
            default = "env terminated" if terminated else "env truncated"
            return ("finished" if terminated else "truncated"), str(info.get("reason", default))
        add = functools.partial(ep.conversation.add_messages, keep_sampled=self.chat.keep_thinking)
        if not await self._render(add, as_messages(obs), "env", max_len):
            return "truncated", context_full(max_len)
        return None

    def _finish(
        self, ep: EpisodeState, status: EpisodeStatus, reason: str, failure: FailureKind | None
    ) -> list[Trajectory]:
        """Count the ending; the episode's trajectories (one per template segment)."""
        self.metrics.count(f"episodes_{status}")
        conversation = ep.conversation
        if failure is not None:
            self.metrics.count(f"failures/{failure}")
        if conversation is None:  # failed before the first render: an empty record
            return [trajectory_of(ep, None, 0, status, reason, failure)]
        self.metrics.count("template_new_segments", conversation.segments_started)
        self.metrics.count("template_reprefilled_tokens", conversation.reprefilled_tokens)
        return [
            trajectory_of(ep, conversation, i, status, reason, failure)
            for i in range(len(conversation.segments))
        ]

    def _snapshot(self, ep: EpisodeState) -> PartialEpisode:
        return snapshot_of(ep, self.client.version)

    def _checkpoint(self, ep: EpisodeState, t_start: float) -> None:
        """Offer the episode at this turn boundary to ``checkpoint``: at its first one,
        then once ``rollout.checkpoint_interval_s`` has passed since the last."""
        if self.checkpoint is None:
            return
        now = time.monotonic()
        last = ep.checkpointed_at
        if last is not None and now - last < self.config.checkpoint_interval_s:
            return
        ep.checkpointed_at = now
        ep.timings.total_s = time.perf_counter() - t_start
        try:
            snapshot = self._snapshot(ep)
        except Exception as e:  # an env whose get_state raises: resume will replay
            self.metrics.count("checkpoint_errors")
            ep.info = {**ep.info, "checkpoint_error": f"{type(e).__name__}: {e}"}
            return
        self.checkpoint(snapshot)

    async def _park(self, ep: EpisodeState) -> None:
        """Wait at the closed admission gate (a weight update is running)."""
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
            raise EpisodeDropped(ep.episode_id, ep.drop_reason, sampled_tokens(ep))

    async def _sample(self, ep: EpisodeState) -> tuple[str, str]:
        """Generate one assistant turn; continue after aborts from the exact prefix."""
        conversation = ep.conversation
        assert conversation is not None
        budget = self.config.max_tokens_per_turn
        sampled = ep.pending
        overflow: ContextOverflowError | None = None
        ep.progress.set_phase("engine")
        while True:
            # Through the turnstile first: from the gate's check to the request, nothing
            # may yield, or a request could reach the engine while a weight update runs.
            await self._turnstile.through()
            if not self.admission.is_set():
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
            await self._turnstile.through()
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
            raise ContextFull(f"{context_full(limit)} (the engine refused it: {overflow})")
        return conversation.messages[-1]["content"], finish

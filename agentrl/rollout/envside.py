"""The env side of an episode: env calls under deadlines, restore, replay, the env log.

:class:`EnvCalls` is the part of :class:`~agentrl.rollout.runner.EpisodeRunner` that
builds, resets, steps, restores and closes envs (sync envs in a worker thread of their
own, every call under ``rollout.env_timeout_s``), keeps the env log (every env step and
every tool call that ran, each with the env's ``get_state()`` snapshot after it when the
env has one), and replays the first episodes of each env from their seed to find envs
that do not replay. The module functions check what envs return.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from agentrl.chat import Conversation, as_messages
from agentrl.chat.formats import ChatFormat
from agentrl.config import RolloutConfig
from agentrl.env import EnvHandle, supports_state
from agentrl.errors import InfraError, RemoteEnvError
from agentrl.jsondata import jsonable
from agentrl.rollout.check_command import check_env_command
from agentrl.rollout.episode import EnvFailure, EpisodeState
from agentrl.rollout.verify import verify_log
from agentrl.runtime.metrics import Metrics
from agentrl.runtime.threads import Deadlines
from agentrl.tools import ToolCall, ToolResult, ToolSet
from agentrl.types import FailureKind, PartialEpisode, Task, Timings, Trajectory

logger = logging.getLogger(__name__)


class EnvCalls:
    """Env handling for :class:`~agentrl.rollout.runner.EpisodeRunner` (a base class)."""

    config: RolloutConfig
    env_deadlines: Deadlines
    """``rollout.env_timeout_s`` for every env call, on one loop timer."""
    metrics: Metrics
    make: Callable[..., Any]
    tokenizer: Any
    chat: ChatFormat
    _replay_checks: dict[str, int]
    _replay_warned: set[str]

    async def _render(self, fn: Callable[..., Any], *args: Any) -> Any:
        raise NotImplementedError

    async def _check_replayable(self, ep: EpisodeState, trajectories: list[Trajectory]) -> None:
        """Replay the first episodes of each env from their seed; record and warn (once per
        env) when one does not replay: resume-by-replay and ``replay --verify`` would fail
        on its episodes (an env drawing from the process-wide ``random``, for example)."""
        env_id = ep.task.env_id
        done = self._replay_checks.get(env_id, 0)
        if done >= REPLAY_CHECKS or len(ep.env_log) < 2:
            return
        self._replay_checks[env_id] = done + 1
        self.metrics.count("replay_checks")
        make = functools.partial(self.make, env_id, **ep.task.env_kwargs)
        try:
            async with self.env_deadlines():
                env = await asyncio.to_thread(make)
                result = await asyncio.to_thread(verify_log, env, ep.task, ep.env_log)
            difference, upto = result.difference, result.steps
        except RemoteEnvError as e:  # its env server went away: nothing was learnt
            logger.info("the replay check of %s was skipped: %s", ep.episode_id, e)
            return
        except Exception as e:  # a replay that raises does not replay either
            difference, upto = f"replaying raised {type(e).__name__}: {e}", len(ep.env_log)
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
                "draws from process-wide state such as the `random` module: `%s` shows it "
                "(it explores from this episode's moves); draw from self.np_random instead",
                ep.episode_id,
                env_id,
                difference,
                check_env_command(ep.task, ep.env_log, upto),
            )

    async def _close(self, ep: EpisodeState) -> None:
        """Close the env under the env deadline; a failing close must not lose the episode."""
        assert ep.handle is not None
        error = None
        if ep.toolset is not None and ep.toolset.holds_sessions:  # MCP sessions, before the env
            with contextlib.suppress(TimeoutError):
                async with self.env_deadlines():
                    await ep.toolset.aclose()
        try:
            async with self.env_deadlines():
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

    async def _start(self, ep: EpisodeState) -> None:
        task = ep.task
        ep.handle = await self._env_call(ep.timings, "make", self._build, task)
        await self._env_call(ep.timings, "open", ep.handle.open, deadline=False)
        obs, ep.info = await self._env_call(
            ep.timings, "reset", checked_reset, ep.handle, task.seed, task.options, task.env_id
        )
        ep.toolset = ToolSet(ep.handle.tools, timeout_s=self.config.tool_timeout_s)
        messages = as_messages(obs)
        ep.env_log.append(self._logged(ep, {"obs": messages}))
        if ep.handle.system_prompt and (not messages or messages[0]["role"] != "system"):
            messages = [{"role": "system", "content": ep.handle.system_prompt}, *messages]
        tools = ep.toolset.schemas or None
        ep.conversation = await self._render(
            functools.partial(
                Conversation,
                self.tokenizer,
                messages,
                tools=tools,
                template_kwargs=self.chat.template_kwargs,
            )
        )

    async def _restore(self, ep: EpisodeState, p: PartialEpisode) -> None:
        task = ep.task
        ep.timings = dataclasses.replace(p.timings)
        ep.handle = await self._env_call(ep.timings, "make", self._build, task)
        await self._env_call(ep.timings, "open", ep.handle.open, deadline=False)
        obs, ep.info = await self._env_call(
            ep.timings, "reset", checked_reset, ep.handle, task.seed, task.options, task.env_id
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
        kwargs = self.chat.template_kwargs
        ep.conversation = Conversation.restore(self.tokenizer, p, template_kwargs=kwargs)
        if p.tools is None:  # a fork built from a trajectory: the env declares them
            ep.conversation.tools = ep.toolset.schemas or None
        ep.rewards = list(p.rewards)
        ep.env_log = [dict(e) for e in p.env_log]
        ep.turn_starts = [dict(t) for t in p.turn_starts]
        ep.tool_calls = p.tool_calls
        ep.info = dict(p.info)
        ep.resumed = resumes_of(p)
        if p.turn_sampled:
            ep.pending = list(ep.conversation.token_ids[-p.turn_sampled :])
        ep.progress.tool_calls = p.tool_calls
        for seg in ep.conversation.segments:
            ep.progress.add_tokens(
                [v for v, m in zip(seg.versions, seg.loss_mask, strict=True) if m]
            )

    async def _replay_log(self, ep: EpisodeState, log: list[dict[str, Any]]) -> None:
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
                    ep.timings, "replay step", checked_step, ep.handle, entry["action"]
                )
                same, what = as_messages(obs) == entry["obs"], "step"
            if not same:
                raise EnvFailure(
                    FailureKind.ENV_REPLAY,
                    f"replaying entry {i} ({what}) gave a different result than the recorded "
                    "one; the env is not deterministic from its seed and actions (give it "
                    "get_state/set_state to make it resumable)",
                )

    def _logged(self, ep: EpisodeState, entry: dict[str, Any]) -> dict[str, Any]:
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

    async def _build(self, task: Task) -> EnvHandle:
        return await EnvHandle.build(self.make, task.env_id, dict(task.env_kwargs))

    async def _env_call(
        self,
        timings: Timings,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        deadline: bool = True,
    ) -> Any:
        """Await an env call under the env deadline (unless ``deadline`` is False: a
        remote env waiting for a server, bounded by ``env.reconnect_timeout_s``); its
        failures fail the episode."""
        t0 = time.perf_counter()
        try:
            if not deadline:
                return await fn(*args)
            async with self.env_deadlines():
                return await fn(*args)
        except TimeoutError:
            raise EnvFailure(
                FailureKind.ENV_TIMEOUT,
                f"{name} took longer than {self.config.env_timeout_s} s (rollout.env_timeout_s)",
            ) from None
        except RemoteEnvError as e:
            raise remote_failure(e) from e
        except (InfraError, EnvFailure, asyncio.CancelledError):
            raise
        except Exception as e:
            raise EnvFailure(
                FailureKind.ENV_EXCEPTION, f"{name} raised {type(e).__name__}: {e}"
            ) from e
        finally:
            timings.env_s += time.perf_counter() - t0


def remote_failure(error: RemoteEnvError) -> EnvFailure:
    """The episode failure of a failed env-server call (its kind, its message)."""
    try:
        kind = FailureKind(error.kind)
    except ValueError:
        kind = FailureKind.ENV_EXCEPTION
    return EnvFailure(kind, str(error))


def context_full(max_len: int) -> str:
    """The truncation reason when the conversation outgrows the context window."""
    return (
        f"context window full ({max_len} tokens): raise inference.max_model_len "
        "(agentrl rollout --max-model-len N)"
    )


def current_state(log: list[dict[str, Any]], handle: EnvHandle) -> dict[str, Any] | None:
    """The env's state now: the snapshot logged with the last entry, else a fresh one."""
    if log and "state" in log[-1]:
        return log[-1]["state"]
    return handle.get_state()


REPLAY_CHECKS = 2
"""Episodes of each env id replayed from their seed after they end (see
``EpisodeRunner._check_replayable``)."""


TOOL_NEVER_RAN = ("unknown_tool", "bad_arguments")
"""Tool errors where the tool function was never called (nothing to replay)."""


def log_tool(call: ToolCall, result: ToolResult) -> dict[str, Any]:
    return {"tool": call.name, "arguments": dict(call.arguments), "result": result.content}


def log_step(
    action: str, obs: Any, reward: float, terminated: bool, truncated: bool
) -> dict[str, Any]:
    return {
        "action": action,
        "obs": as_messages(obs),
        "reward": reward,
        "terminated": terminated,
        "truncated": truncated,
    }


class ContextFull(Exception):
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
                problem = (
                    f"a list whose message {i} has content of type "
                    f"{type(m.get('content')).__name__}"
                )
            if problem:
                break
    if problem:
        raise EnvFailure(
            FailureKind.ENV_BAD_OBSERVATION,
            f"{env_id} {where} returned {problem} ({obs!r:.120}); "
            f"expected a str, or a list of {{'role': one of {list(_ROLES)}, 'content': str}} "
            "messages",
        )


async def checked_reset(
    handle: EnvHandle, seed: int | None, options: dict[str, Any] | None, env_id: str = "the env"
) -> tuple[Any, dict[str, Any]]:
    obs, info = await handle.reset(seed=seed, options=options)
    _check_observation(obs, env_id, "reset()")
    return obs, dict(info or {})


async def checked_step(
    handle: EnvHandle, text: str, env_id: str = "the env"
) -> tuple[Any, float, bool, bool, dict[str, Any]]:
    obs, reward, terminated, truncated, info = await handle.step(text)
    _check_observation(obs, env_id, "step()")
    return obs, float(reward), bool(terminated), bool(truncated), dict(info or {})


def sampled_tokens(ep: EpisodeState) -> int:
    conv = ep.conversation
    return sum(sum(s.loss_mask) for s in conv.segments) if conv is not None else 0


def resumes_of(p: PartialEpisode) -> list[dict[str, int]]:
    """The resumes ``p`` records, plus this one (from ``p``): where it continues (segment,
    token position, turn) and the version at the checkpoint. A fork point (version -1)
    is not a checkpoint: not listed."""
    earlier = list(p.info.get("resumed", []))
    if p.version < 0 or not p.segments:
        return earlier
    at = {
        "segment": len(p.segments) - 1,
        "token": len(p.segments[-1].token_ids),
        "turn": p.turn,
        "version": p.version,
    }
    return [*earlier, at]


def info_of(ep: EpisodeState) -> dict[str, Any]:
    """What a checkpoint or trajectory records as ``info``: the env's, and the resumes."""
    info = jsonable(ep.info)
    if ep.resumed:
        info["resumed"] = list(ep.resumed)
    return info

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
* ``failed``: the env raised (in ``reset`` or ``step``) or returned something that is
  not an observation; ``reason`` holds the exception.

Engine failures are not episode failures: they raise :class:`InfraError` and stop the
run. Sync envs and tools run in worker threads; only the event loop coordinates.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import Callable
from typing import Any

from agentrl.chat import Conversation, as_messages
from agentrl.env import EnvHandle, make_env
from agentrl.errors import ContextOverflowError, InfraError
from agentrl.inference.base import InferenceClient, SamplingConfig
from agentrl.metrics import Metrics
from agentrl.tools import ToolSet
from agentrl.types import EpisodeStatus, Task, Timings, Trajectory

_request_ids = itertools.count()


@dataclasses.dataclass(frozen=True, slots=True)
class RolloutConfig:
    """How episodes are run."""

    max_turns: int = 8
    """Assistant turns per episode (tool turns included)."""
    max_tool_calls: int = 8
    max_tokens_per_turn: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    tool_timeout_s: float = 10.0
    env_timeout_s: float = 60.0
    """Deadline for one env reset or step; past it the episode fails."""

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_tokens_per_turn"):
            if getattr(self, name) < 1:
                raise ValueError(f"RolloutConfig.{name} must be >= 1, got {getattr(self, name)}")

    def sampling(self, max_tokens: int) -> SamplingConfig:
        return SamplingConfig(max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p)


@dataclasses.dataclass(slots=True)
class EpisodeProgress:
    """Live state of a running episode, for progress views."""

    episode_id: str
    env_id: str
    turn: int = 0
    phase: str = "env"
    """What it waits on now: engine, tool or env."""
    started_version: int = 0
    sampled: int = 0
    started_at: float = dataclasses.field(default_factory=time.monotonic)


class EnvFailure(Exception):
    """The env raised or misbehaved; the episode fails with this reason."""


class EpisodeRunner:
    """Runs episodes against one inference client.

    Args:
        client: the inference engine.
        tokenizer: the model's tokenizer (chat template included).
        config: limits and sampling.
        metrics: where counts and timings go.
        make: builds an env from an id and keyword arguments (default: Gymnasium).
        admission: awaited before every generation call; a weight update closes it to
            hold new requests back (see the rollout controller).
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
    ) -> None:
        self.client = client
        self.tokenizer = tokenizer
        self.config = config or RolloutConfig()
        self.metrics = metrics or Metrics()
        self.make = make
        self.admission = admission
        self.live: dict[str, EpisodeProgress] = {}

    async def run(self, task: Task, episode_id: str, attempt: int = 0) -> list[Trajectory]:
        """Run one episode; return its trajectory (several if the template re-segmented)."""
        progress = EpisodeProgress(episode_id, task.env_id, started_version=self.client.version)
        self.live[episode_id] = progress
        self.metrics.count("episodes_started")
        try:
            return await self._run(task, episode_id, attempt, progress)
        finally:
            del self.live[episode_id]

    async def _run(
        self, task: Task, episode_id: str, attempt: int, progress: EpisodeProgress
    ) -> list[Trajectory]:
        cfg = self.config
        timings = Timings()
        t_start = time.perf_counter()
        rewards: list[float] = []
        status: EpisodeStatus = "truncated"
        reason = f"turn limit ({cfg.max_turns}) reached"
        info: dict[str, Any] = {}
        conversation: Conversation | None = None
        handle: EnvHandle | None = None
        try:
            handle = await self._env_call(timings, "make", self._build, task)
            obs, info = await self._env_call(
                timings, "reset", _checked_reset, handle, task.seed, task.options
            )
            toolset = ToolSet(handle.tools, timeout_s=cfg.tool_timeout_s)
            messages = as_messages(obs)
            if handle.system_prompt and (not messages or messages[0]["role"] != "system"):
                messages.insert(0, {"role": "system", "content": handle.system_prompt})
            conversation = Conversation(self.tokenizer, messages, tools=toolset.schemas or None)
            tool_calls = 0
            max_len = self.client.max_model_len
            while conversation.turn < cfg.max_turns:
                progress.turn = conversation.turn
                if len(conversation) >= max_len:
                    status, reason = "truncated", "context window full"
                    break
                text, finish = await self._sample(conversation, progress, timings)
                if finish == "length" and len(conversation) >= max_len:
                    status, reason = "truncated", "context window full"
                    break
                parsed = toolset.parse(text)
                if parsed.has_tool_activity:
                    tool_calls += len(parsed.calls) + len(parsed.errors)
                    if tool_calls > cfg.max_tool_calls:
                        status, reason = "truncated", f"tool-call limit ({cfg.max_tool_calls})"
                        break
                    progress.phase = "tool"
                    t0 = time.perf_counter()
                    results = [await toolset.call(c) for c in parsed.calls] + list(parsed.errors)
                    timings.tools_s += time.perf_counter() - t0
                    rewards.append(0.0)
                    tool_messages = [
                        {"role": "tool", "name": r.name, "content": r.content} for r in results
                    ]
                    if not conversation.add_messages(tool_messages, "tool", max_len):
                        status, reason = "truncated", "context window full"
                        break
                    continue
                progress.phase = "env"
                obs, reward, terminated, truncated, info = await self._env_call(
                    timings, "step", _checked_step, handle, text
                )
                rewards.append(float(reward))
                if terminated or truncated:
                    status = "finished" if terminated else "truncated"
                    reason = str(
                        info.get("reason", "env terminated" if terminated else "env truncated")
                    )
                    break
                if not conversation.add_messages(as_messages(obs), "env", max_len):
                    status, reason = "truncated", "context window full"
                    break
            for kind, n in toolset.errors.items():
                self.metrics.count(f"tool_errors/{kind}", n)
        except EnvFailure as e:
            status, reason = "failed", str(e)
        finally:
            if handle is not None:
                try:
                    await handle.close()
                except Exception as e:  # a failing close must not lose the episode
                    self.metrics.count("env_close_errors")
                    info = {**info, "close_error": f"{type(e).__name__}: {e}"}
        timings.total_s = time.perf_counter() - t_start
        self.metrics.count(f"episodes_{status}")
        if conversation is None:  # failed before the first render: an empty record
            self.metrics.count(f"failures/{reason.split(':')[0]}")
            return [self._trajectory(task, episode_id, attempt, None, 0, status, reason, rewards,
                                     timings, info)]  # fmt: skip
        if status == "failed":
            self.metrics.count(f"failures/{reason.split(':')[0]}")
        self.metrics.count("template_new_segments", conversation.segments_started)
        return [
            self._trajectory(task, episode_id, attempt, conversation, i, status, reason, rewards,
                             timings, info)
            for i in range(len(conversation.segments))
        ]  # fmt: skip

    async def _build(self, task: Task) -> EnvHandle:
        return EnvHandle(await asyncio.to_thread(self.make, task.env_id, **task.env_kwargs))

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
                f"env_timeout: {name} took longer than {self.config.env_timeout_s} s"
            ) from None
        except (InfraError, asyncio.CancelledError):
            raise
        except Exception as e:
            raise EnvFailure(f"env_exception: {name} raised {type(e).__name__}: {e}") from e
        finally:
            timings.env_s += time.perf_counter() - t0

    async def _sample(
        self, conversation: Conversation, progress: EpisodeProgress, timings: Timings
    ) -> tuple[str, str]:
        """Generate one assistant turn; continue after aborts from the exact prefix."""
        budget = self.config.max_tokens_per_turn
        sampled: list[int] = []
        progress.phase = "engine"
        while True:
            if self.admission is not None and not self.admission.is_set():
                t0 = time.perf_counter()
                await self.admission.wait()
                timings.engine_wait_s += time.perf_counter() - t0
            room = self.client.max_model_len - len(conversation)
            max_tokens = min(budget - len(sampled), room)
            if max_tokens < 1:
                finish = "length"
                break
            t0 = time.perf_counter()
            try:
                gen = await self.client.generate(
                    conversation.token_ids,
                    self.config.sampling(max_tokens),
                    f"{progress.episode_id}-{next(_request_ids)}",
                )
            except ContextOverflowError:
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
                timings.generate_s += time.perf_counter() - t0
            conversation.add_sampled(gen.token_ids, gen.logprobs, gen.versions)
            sampled.extend(gen.token_ids)
            progress.sampled += len(gen.token_ids)
            self.metrics.count("tokens_sampled", len(gen.token_ids))
            if gen.finish_reason != "abort":
                finish = gen.finish_reason
                break
            self.metrics.count("generations_resumed")
        conversation.end_assistant_turn(conversation.decode(sampled), finish)
        return conversation.messages[-1]["content"], finish

    def _trajectory(
        self,
        task: Task,
        episode_id: str,
        attempt: int,
        conversation: Conversation | None,
        index: int,
        status: EpisodeStatus,
        reason: str,
        rewards: list[float],
        timings: Timings,
        info: dict[str, Any],
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
            episode_id=episode_id,
            task_id=task.task_id,
            env_id=task.env_id,
            seed=task.seed,
            messages=messages,
            turn_rewards=list(rewards),
            reward=float(sum(rewards)),
            status=status,
            reason=reason,
            segment=index,
            attempt=attempt,
            timings=timings,
            info=_jsonable(info),
            **arrays,
        )


async def _checked_reset(
    handle: EnvHandle, seed: int | None, options: dict[str, Any] | None
) -> tuple[Any, dict[str, Any]]:
    obs, info = await handle.reset(seed=seed, options=options)
    return obs, dict(info or {})


async def _checked_step(
    handle: EnvHandle, text: str
) -> tuple[Any, float, bool, bool, dict[str, Any]]:
    obs, reward, terminated, truncated, info = await handle.step(text)
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

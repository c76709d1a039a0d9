"""The environment contract: text environments as real ``gymnasium.Env`` subclasses.

An agentrl environment is a Gymnasium env whose observation is text (a string, or a
list of chat messages) and whose action is the model's text for one turn::

    class MyEnv(agentrl.TextEnv):
        tools = [calculator]                       # functions the agent may call

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)                # seeds self.np_random
            return "What is 2 + 2?", {}

        def step(self, action: str):
            right = action.strip().endswith("4")
            return "", float(right), True, False, {}

``terminated`` means the task ended; ``truncated`` means a limit was hit. ``info`` is a
fresh dict on every call. Optional ``get_state()``/``set_state()`` (JSON-serialisable
state) make an env resumable and forkable; optional ``areset``/``astep`` let envs that
do I/O run on the event loop (sync envs run in a thread).

This module owns the text spaces, :class:`TextEnv` and :class:`EnvHandle` (how the
rollout engine drives one env); registration through Gymnasium's own registry and the
``agentrl.envs`` plugins live in :mod:`agentrl.env.registry` (importable from here). It
never calls a model. The checks live in :mod:`agentrl.check`.
"""

from __future__ import annotations

import asyncio
import functools
import re
import string
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from agentrl.env.registry import (
    ENV_ENTRY_POINTS,
    check_env_config,
    import_env_modules,
    load_env_plugins,
    make_env,
    register_env,
)
from agentrl.runtime.threads import ThreadLane
from agentrl.types import dump_json

__all__ = [
    "ENV_ENTRY_POINTS",
    "ENV_THREADS",
    "AsyncTextEnv",
    "EnvHandle",
    "Message",
    "MessagesSpace",
    "Observation",
    "TextEnv",
    "TextSpace",
    "check_env_config",
    "final_answer_step",
    "import_env_modules",
    "load_env_plugins",
    "make_env",
    "parse_final_answer",
    "register_env",
    "supports_state",
]

Message = dict[str, Any]
Observation = str | list[Message]

_SAMPLE_CHARSET = string.ascii_letters + string.digits + string.punctuation + " \n"


class TextSpace(spaces.Text):
    """Any Python string up to ``max_length`` characters.

    Gymnasium's ``spaces.Text`` admits only alphanumerics by default, so real model
    output (spaces, punctuation, unicode) would fail its checker. ``contains`` accepts
    every string within the length bounds; ``sample`` draws printable ASCII.
    """

    def __init__(self, max_length: int = 100_000, *, min_length: int = 0, seed: Any = None):
        super().__init__(max_length, min_length=min_length, charset=_SAMPLE_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"TextSpace({self.min_length}, {self.max_length})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TextSpace)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )


class MessagesSpace(spaces.Space[list[Message]]):
    """A list of chat messages: dicts with a ``role`` and string ``content``."""

    ROLES: ClassVar[frozenset[str]] = frozenset({"system", "user", "assistant", "tool"})

    def __init__(self, max_messages: int = 1000, seed: Any = None) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)
        self.max_messages = max_messages

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        n = int(self.np_random.integers(1, 4))
        chars = np.array(list(_SAMPLE_CHARSET))
        return [
            {"role": "user", "content": "".join(self.np_random.choice(chars, size=12))}
            for _ in range(n)
        ]

    def contains(self, x: Any) -> bool:
        return (
            isinstance(x, list)
            and len(x) <= self.max_messages
            and all(
                isinstance(m, dict)
                and m.get("role") in self.ROLES
                and isinstance(m.get("content", ""), str)
                for m in x
            )
        )

    def __repr__(self) -> str:
        return f"MessagesSpace({self.max_messages})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MessagesSpace) and other.max_messages == self.max_messages


class TextEnv(gym.Env[Observation, str]):
    """Base class for text environments: text observations, text actions, tools.

    Subclasses implement ``reset`` and ``step`` exactly as Gymnasium specifies and may
    set ``tools`` (typed functions or :class:`agentrl.tools.Tool`) and
    ``system_prompt``. Observations default to :class:`TextSpace`; set
    ``observation_space = MessagesSpace()`` to return chat messages instead.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    tools: ClassVar[Sequence[Callable[..., Any]]] = ()
    system_prompt: ClassVar[str | None] = None
    observation_space: spaces.Space[Any] = TextSpace()
    action_space: spaces.Space[Any] = TextSpace()

    def get_state(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot of the env (override to make it resumable)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement get_state()")

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore a snapshot from :meth:`get_state` (override to make it resumable)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement set_state()")


class AsyncTextEnv(TextEnv):
    """A text env whose reset and step are coroutines (for envs that do I/O).

    Implement ``areset`` and ``astep``; call ``await super().areset(seed=seed)`` first
    in ``areset`` to seed ``self.np_random``. The rollout engine awaits them on its
    event loop; the sync ``reset``/``step`` (for Gymnasium's checker and plain scripts)
    run them with ``asyncio.run`` and refuse to run inside a running loop.
    """

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        gym.Env.reset(self, seed=seed)
        return "", {}

    async def astep(self, action: str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        raise NotImplementedError(f"{type(self).__name__} must implement astep()")

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        return _run_sync(self.areset(seed=seed, options=options), "reset")

    def step(self, action: str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        return _run_sync(self.astep(action), "step")


def _run_sync(coro: Awaitable[Any], name: str) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)  # type: ignore[arg-type]
    coro.close()  # type: ignore[attr-defined]
    raise RuntimeError(
        f"{name}() of an async env was called inside a running event loop; "
        f"use `await env.a{name}(...)` (or agentrl.env.EnvHandle) instead"
    )


class _EnvThreads:
    """Single-thread lanes (:class:`~agentrl.runtime.threads.ThreadLane`) for envs, kept for
    the next env when one is let go.

    Each env has a worker thread to itself while it lives (so a call that hangs holds
    only that env's thread); an env closed with no call left running hands its thread
    back, and the next env takes it instead of starting a thread (starting and stopping
    one per episode was a tenth of the rollout loop's CPU). A thread stuck in a call
    that missed its deadline is never handed back: it is let go.
    """

    def __init__(self, keep: int = 4096) -> None:
        self.keep = keep
        self._free: dict[str, list[ThreadLane]] = {}
        self._lock = threading.Lock()

    def take(self, name: str) -> ThreadLane:
        with self._lock:
            free = self._free.get(name)
            if free:
                return free.pop()
        return ThreadLane(name)

    def give_back(self, name: str, lane: ThreadLane) -> None:
        with self._lock:
            free = self._free.setdefault(name, [])
            if len(free) < self.keep:
                free.append(lane)
                return
        lane.close()

    def drain(self) -> int:
        """Stop the threads waiting to be taken; return how many there were."""
        with self._lock:
            free = [lane for lanes in self._free.values() for lane in lanes]
            self._free.clear()
        for lane in free:
            lane.close()
        return len(free)

    def idle(self) -> int:
        """Threads waiting to be taken."""
        with self._lock:
            return sum(map(len, self._free.values()))


ENV_THREADS = _EnvThreads()


def _step_limit(env: gym.Env[Any, Any]) -> int | None:
    """``env.spec.max_episode_steps``, read where it lives: the outermost ``TimeLimit``'s
    limit, else the env's own spec. (A wrapper's ``spec`` property deep-copies the spec
    under it: a tenth of an episode's start against an instant engine.)"""
    while isinstance(env, gym.Wrapper):
        if isinstance(env, gym.wrappers.TimeLimit):
            return int(env._max_episode_steps)
        env = env.env
    return getattr(getattr(env, "spec", None), "max_episode_steps", None)


def _closes_nothing(env: Any) -> bool:
    """Whether ``env.close()`` does nothing: every wrapper's ``close`` is Gymnasium's (it
    only closes the env under it) and the env's own is ``gym.Env.close`` (which does
    nothing)."""
    while isinstance(env, gym.Wrapper):
        if type(env).close is not gym.Wrapper.close:
            return False
        env = env.env
    return isinstance(env, gym.Env) and type(env).close is gym.Env.close


class EnvHandle:
    """How the rollout engine drives one env without ever blocking its event loop.

    Awaits ``areset``/``astep`` when the env defines them, else runs the sync
    ``reset``/``step`` in a worker thread of its own: a call that hangs past its
    deadline holds only that thread, never the threads other episodes need. On the
    async path the Gymnasium wrappers are bypassed, so the registered
    ``max_episode_steps`` is applied here.

    An async env whose state lives elsewhere (a remote env,
    :class:`agentrl.remote.RemoteEnv`) may also define ``aopen()`` (awaited once before
    the first reset, without the env deadline: it may wait for a server),
    ``aset_state(state, steps)`` and ``aclose()``; they are awaited instead of the sync
    ``set_state`` and ``close``.
    """

    @classmethod
    async def build(
        cls,
        make: Callable[..., Any],
        env_id: str,
        kwargs: dict[str, Any],
        *,
        thread_name: str = "agentrl-env",
    ) -> EnvHandle:
        """``make(env_id, **kwargs)`` in the env's own worker thread (constructors may do
        I/O too), wrapped; the thread goes with the handle of a sync env, back for the next
        env at once for an async one (its calls are awaited on the loop: then only envs
        being built hold threads, not every env alive), or is let go if ``make`` fails."""
        lane = ENV_THREADS.take(thread_name)
        try:
            env = await lane.call(functools.partial(make, env_id, **kwargs))
        except BaseException:  # make may still be running (cancelled, timed out)
            lane.close(cancel_pending=True)
            raise
        handle = cls(env, lane, thread_name=thread_name)
        if handle.is_async:  # a close that does something takes one again
            handle._lane = None
            ENV_THREADS.give_back(thread_name, lane)
        return handle

    def __init__(
        self,
        env: gym.Env[Any, Any],
        lane: ThreadLane | None = None,
        *,
        thread_name: str = "agentrl-env",
    ) -> None:
        self.env = env
        self._lane = lane
        self._thread_name = thread_name
        self._abandoned = False
        self.inner = env.unwrapped
        self.is_async = callable(getattr(self.inner, "astep", None)) and callable(
            getattr(self.inner, "areset", None)
        )
        self.max_steps: int | None = _step_limit(env) if self.is_async else None
        self.steps = 0

    @property
    def tools(self) -> Sequence[Callable[..., Any]]:
        return tuple(getattr(self.inner, "tools", ()) or ())

    @property
    def system_prompt(self) -> str | None:
        return getattr(self.inner, "system_prompt", None)

    async def open(self) -> None:
        """Await the env's ``aopen()`` if it has one (a remote env takes its session)."""
        aopen = getattr(self.inner, "aopen", None)
        if callable(aopen):
            await aopen()

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        self.steps = 0
        if self.is_async:
            return await self.inner.areset(seed=seed, options=options)
        return await self._thread(functools.partial(self.env.reset, seed=seed, options=options))

    async def step(self, action: str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        self.steps += 1
        if not self.is_async:
            return await self._thread(functools.partial(self.env.step, action))
        obs, reward, terminated, truncated, info = await self.inner.astep(action)
        if self.max_steps is not None and self.steps >= self.max_steps:
            truncated = True
        return obs, reward, terminated, truncated, info

    async def close(self) -> None:
        aclose = getattr(self.inner, "aclose", None)
        if self.is_async and callable(aclose):
            await aclose()
            return
        if _closes_nothing(self.env):  # no thread hop for a call that does nothing
            return
        if self._lane is not None and self._lane.busy:  # stuck in a call past its deadline
            spare = ThreadLane(f"{self._thread_name}-close")
            try:
                await spare.call(self.env.close)
            finally:
                spare.close()
            return
        await self._thread(self.env.close)

    async def _thread(self, fn: Callable[[], Any]) -> Any:
        if self._abandoned:
            raise RuntimeError(f"the env {self.inner!r} was closed; it takes no more calls")
        if self._lane is None:
            self._lane = ENV_THREADS.take(self._thread_name)
        return await self._lane.call(fn)

    def raise_if_lost(self) -> None:
        """Raise why the env is gone, if it is (a remote env whose server went away
        during a tool call: :class:`~agentrl.errors.RemoteEnvError`); else nothing."""
        check = getattr(self.inner, "raise_if_lost", None)
        if callable(check):
            check()

    def abandon(self) -> None:
        """Let go of the worker thread (after close): it goes back for the next env, or,
        stuck in a hung call, is left to it."""
        self._abandoned = True
        lane, self._lane = self._lane, None
        if lane is None:
            return
        if lane.busy:
            lane.close(cancel_pending=True)
        else:
            ENV_THREADS.give_back(self._thread_name, lane)

    def get_state(self) -> dict[str, Any] | None:
        """The env's snapshot when it has ``get_state`` and the snapshot is JSON; else None."""
        if not supports_state(self.env):
            return None
        state = self.inner.get_state()
        try:
            dump_json(state)
        except (TypeError, ValueError):
            return None  # not storable: resume will replay the actions instead
        return state

    async def set_state(self, state: dict[str, Any], steps: int) -> None:
        """Restore a snapshot taken after ``steps`` steps (step limits count them too)."""
        aset_state = getattr(self.inner, "aset_state", None)
        if self.is_async and callable(aset_state):
            await aset_state(state, steps)
        elif self.is_async:
            self.inner.set_state(state)
        else:
            await self._thread(functools.partial(self.inner.set_state, state))
        self.steps = steps
        env: Any = self.env
        while isinstance(env, gym.Wrapper):  # TimeLimit counts steps; carry them over
            if hasattr(env, "_elapsed_steps"):
                env._elapsed_steps = steps
            env = env.env


_FINAL_ANSWER = re.compile(r"Answer:\s*(-?\d{1,40})(?!\d)")


def parse_final_answer(text: str) -> int | None:
    """The integer N of the last ``Answer: N`` in ``text``, or None."""
    found = _FINAL_ANSWER.findall(text)
    return int(found[-1]) if found else None


def final_answer_step(action: str, target: int) -> tuple[str, float, bool, bool, dict[str, Any]]:
    """The step of a one-answer task: reward 1 if the turn's ``Answer: N`` equals ``target``."""
    answer = parse_final_answer(action)
    if answer is None:
        return "", 0.0, True, False, {"reason": "no 'Answer: N' in the final turn"}
    right = answer == target
    return "", float(right), True, False, {"reason": "right" if right else "wrong answer"}


def supports_state(env: Any) -> bool:
    """Whether ``env`` (unwrapped) overrides both ``get_state`` and ``set_state``."""
    inner = getattr(env, "unwrapped", env)
    cls = type(inner)
    if isinstance(inner, TextEnv):
        return cls.get_state is not TextEnv.get_state and cls.set_state is not TextEnv.set_state
    return callable(getattr(inner, "get_state", None)) and callable(
        getattr(inner, "set_state", None)
    )

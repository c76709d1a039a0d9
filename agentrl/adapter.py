"""Train on a Gymnasium env you already have: render observations as text, parse actions.

Two lines turn a toy-text env into an agentrl env::

    env = agentrl.from_gym("FrozenLake-v1", is_slippery=False)   # id + make() kwargs
    env = GymTextAdapter(my_env, action_names=["left", "right"])   # an env object

:class:`GymTextAdapter` wraps a ``gymnasium.Env``, or any object with the same ``reset
-> (obs, info)`` and ``step(a) -> 5-tuple`` shape that does not subclass it: ``reset``
may take ``seed`` and ``options`` by keyword, ``seed`` only, ``seed`` positionally, or
nothing (then the object's own ``seed(n)`` is called when it has one). Observations
become text: ``render_mode="ansi"`` output (colour highlights turned into visible
markers), else ``str(obs)``, or your ``render`` function. Actions are parsed from the
model's text: for ``Discrete`` spaces the last action name (or index) mentioned, else
your ``parse_action``. A reply with no action gets a hint back and no step;
``max_invalid`` of those in a row truncate the episode.

The adapter is resumable and forkable without help from the inner env: its state is
the episode's seed plus the action texts so far, and ``set_state`` replays them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
from gymnasium import spaces

from agentrl.env import TextEnv

#: Action names and task descriptions of Gymnasium's toy-text envs, by spec name.
KNOWN_ENVS: dict[str, tuple[tuple[str, ...], str]] = {
    "FrozenLake": (
        ("left", "down", "right", "up"),
        "You walk on a frozen lake; [X] marks where you stand. S is the start, F frozen "
        "ice, H a hole, G the goal. Reach G without stepping into a hole.",
    ),
    "CliffWalking": (
        ("up", "right", "down", "left"),
        "Walk from x to T along the grid; C cells are a cliff that sends you back to the "
        "start. o is open ground and x is where you stand.",
    ),
    "Taxi": (
        ("south", "north", "east", "west", "pickup", "dropoff"),
        "You drive the taxi at [ ] (it shows [X] on a letter). Pick up the passenger at "
        "the letter in (parentheses) and drop them off at the letter in {braces}. "
        "Walls | block east-west moves.",
    ),
}

_ANSI = re.compile(r"\x1b\[([\d;]*)m([^\x1b]*)\x1b\[0m")
_ANY_ANSI = re.compile(r"\x1b\[[\d;]*[A-Za-z]")
_INT = re.compile(r"(?<![\w.])-?\d{1,9}(?![\w.])")


def ansi_to_text(text: str) -> str:
    """Turn colour highlights into visible markers and drop other escape codes.

    Background highlights become ``[x]``, blue text ``(x)``, magenta ``{x}``, other
    colours ``*x*``: the positions toy-text envs show only by colour stay visible.
    """

    def mark(match: re.Match[str]) -> str:
        codes = {int(c) for c in match.group(1).split(";") if c}
        inner = match.group(2)
        if codes & set(range(40, 48)):
            return f"[{inner}]"
        if 34 in codes:
            return f"({inner})"
        if 35 in codes:
            return f"{{{inner}}}"
        return f"*{inner}*"

    previous = None
    while previous != text:  # nested highlights: innermost first
        previous, text = text, _ANSI.sub(mark, text)
    return _ANY_ANSI.sub("", text)


class GymTextAdapter(TextEnv):
    """A Gymnasium env (or a look-alike) as a text env.

    Args:
        env: a ``gymnasium.Env`` or an object with the same ``reset``/``step`` shape.
        description: the task, shown before the first observation. Defaults to a
            known description for toy-text envs, else none.
        action_names: names for ``Discrete`` actions, in index order. Defaults to the
            known names for toy-text envs, else the indices.
        render: ``(obs, env) -> str``; defaults to ANSI rendering or ``str(obs)``.
        parse_action: ``text -> action or None``; required for non-``Discrete`` spaces.
        max_invalid: replies in a row without an action before the episode truncates.
    """

    def __init__(
        self,
        env: Any,
        *,
        description: str | None = None,
        action_names: Sequence[str] | None = None,
        render: Callable[[Any, Any], str] | None = None,
        parse_action: Callable[[str], Any] | None = None,
        max_invalid: int = 3,
    ) -> None:
        for method in ("reset", "step"):
            if not callable(getattr(env, method, None)):
                raise TypeError(
                    f"{type(env).__name__} has no {method}(); GymTextAdapter needs an object "
                    "with Gymnasium's reset(seed=, options=) and step(action) methods"
                )
        self.env = env
        spec = getattr(env, "spec", None)
        known_names, known_description = KNOWN_ENVS.get(getattr(spec, "name", ""), ((), None))
        self.description = description if description is not None else known_description
        self.render_fn = render
        self.max_invalid = max_invalid
        self.inner_action_space = getattr(env, "action_space", None)
        if parse_action is None:
            if not isinstance(self.inner_action_space, spaces.Discrete):
                raise TypeError(
                    f"the action space {self.inner_action_space!r} is not Discrete; pass "
                    "parse_action=text -> action (or None when the text has no action)"
                )
            n, start = int(self.inner_action_space.n), int(self.inner_action_space.start)
            names = tuple(action_names or known_names or [str(i + start) for i in range(n)])
            if len(names) != n:
                raise ValueError(f"{len(names)} action_names for a Discrete({n}) action space")
            self.action_names: tuple[str, ...] = names
            self.parse_action = self._parse_discrete
        else:
            self.action_names = tuple(action_names or ())
            self.parse_action = parse_action
        self._seed = 0
        self._texts: list[str] = []
        self._invalid = 0
        self._last_text = ""

    def _parse_discrete(self, text: str) -> int | None:
        start = int(self.inner_action_space.start)
        lowered = text.lower()
        best: tuple[int, int] | None = None  # (position, action): the last one mentioned
        for i, name in enumerate(self.action_names):
            for m in re.finditer(rf"(?<![a-z0-9]){re.escape(name.lower())}(?![a-z0-9])", lowered):
                if best is None or m.start() > best[0]:
                    best = (m.start(), i + start)
        if best is None:
            for m in _INT.finditer(text):
                value = int(m.group())
                if self.inner_action_space.contains(value):
                    best = (m.start(), value)
        return None if best is None else best[1]

    def _render(self, obs: Any) -> str:
        if self.render_fn is not None:
            return self.render_fn(obs, self.env)
        if getattr(self.env, "render_mode", None) == "ansi":
            return ansi_to_text(str(self.env.render())).strip("\n")
        return obs if isinstance(obs, str) else str(obs)

    def _actions_hint(self) -> str:
        if self.action_names:
            return "Reply with one action: " + ", ".join(self.action_names) + "."
        return "Reply with an action."

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        # Always seed the inner env, so every episode can be replayed by set_state.
        self._seed = int(self.np_random.integers(2**31 - 1))
        self._texts, self._invalid = [], 0
        obs, info = self._checked_reset(options)
        self._last_text = self._render(obs)
        parts = [self.description, self._last_text, self._actions_hint()]
        return "\n\n".join(p for p in parts if p), dict(info)

    def _checked_reset(self, options: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
        out = _reset(self.env, self._seed, options)
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
            raise TypeError(
                f"{type(self.env).__name__}.reset() returned {type(out).__name__}; expected "
                "(observation, info) as in Gymnasium >= 0.26"
            )
        return out

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._texts.append(action)
        return self._step(action)

    def _step(self, text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        parsed = self.parse_action(text)
        if parsed is None:
            self._invalid += 1
            if self._invalid >= self.max_invalid:
                reason = f"{self._invalid} replies in a row had no action"
                return "", 0.0, False, True, {"reason": reason}
            hint = f"I could not find an action in your reply. {self._actions_hint()}"
            return f"{hint}\n\n{self._last_text}", 0.0, False, False, {"reason": "no action"}
        self._invalid = 0
        out = self.env.step(parsed)
        if not (isinstance(out, tuple) and len(out) == 5):
            raise TypeError(
                f"{type(self.env).__name__}.step() returned a {len(out)}-tuple; expected "
                "(obs, reward, terminated, truncated, info) as in Gymnasium >= 0.26"
            )
        obs, reward, terminated, truncated, info = out
        self._last_text = self._render(obs)
        return self._last_text, float(reward), bool(terminated), bool(truncated), dict(info)

    def get_state(self) -> dict[str, Any]:
        return {"seed": self._seed, "actions": list(self._texts)}

    def set_state(self, state: dict[str, Any]) -> None:
        self._seed = int(state["seed"])
        self._texts, self._invalid = [], 0
        obs, _ = self._checked_reset(None)
        self._last_text = self._render(obs)
        for text in state["actions"]:
            self.step(text)

    def render(self) -> str:
        return self._last_text

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()


def _reset(env: Any, seed: int, options: dict[str, Any] | None) -> Any:
    """Call ``env.reset`` with the seed (and options) in the form its signature takes."""
    import inspect

    try:
        params = inspect.signature(env.reset).parameters
    except (TypeError, ValueError):  # a builtin or C extension: try Gymnasium's form
        return env.reset(seed=seed, options=options)
    kinds = {p.kind for p in params.values()}
    if inspect.Parameter.VAR_KEYWORD in kinds or ("seed" in params and "options" in params):
        return env.reset(seed=seed, options=options)
    if options:
        raise TypeError(
            f"{type(env).__name__}.reset{inspect.signature(env.reset)} takes no options, but "
            f"the task has options {options!r}"
        )
    if "seed" in params and params["seed"].kind != inspect.Parameter.POSITIONAL_ONLY:
        return env.reset(seed=seed)
    if params and next(iter(params.values())).kind in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.VAR_POSITIONAL,
    ):
        return env.reset(seed)
    seed_fn = getattr(env, "seed", None)
    if callable(seed_fn):  # the pre-0.26 Gym convention: seed(n), then reset()
        seed_fn(seed)
    return env.reset()


def from_gym(
    env_id: str, *, adapter: dict[str, Any] | None = None, **kwargs: Any
) -> GymTextAdapter:
    """``gymnasium.make(env_id, render_mode="ansi", **kwargs)`` wrapped in the adapter.

    Falls back to no render mode for envs without ``ansi``; ``adapter`` holds keyword
    arguments for :class:`GymTextAdapter`.
    """
    try:
        env = gym.make(env_id, render_mode="ansi", **kwargs)
    except (gym.error.Error, TypeError, ValueError):
        env = gym.make(env_id, **kwargs)
    return GymTextAdapter(env, **(adapter or {}))

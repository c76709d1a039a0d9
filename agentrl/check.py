"""``check_env``: Gymnasium's checker plus the rules LLM environments need.

Rules, each reported by name with what the env did and what was expected:

* ``gymnasium``: ``gymnasium.utils.env_checker.check_env`` passes;
* ``seeded-determinism``: the same seed and actions give the same episode, whatever
  state the process-wide RNGs (``random``, ``numpy.random``) are in;
* ``isolation``: two interleaved instances with different seeds give the same
  episodes as each alone (catches envs that use the process-wide ``random``);

Both explore with actions beyond a fixed script: words and numbers the env's own
observations mention (and an adapter's action names) are tried, chosen by a local
seeded RNG, so moves that draw at step time are made and replayed. Moves in a syntax
none of those produce (``reveal 3 4``) are reached from example actions: given to
:func:`check_env` (``agentrl check-env ID --example-action TEXT``) or listed by the env
in an ``example_actions`` attribute; half the explored moves are those examples, their
numbers changed to others (0-9 and those the observation mentions).
* ``state-round-trip``: ``get_state`` is JSON-serialisable and ``set_state`` of it
  continues the episode identically (only for envs that implement both);
* ``robust-actions``: empty, huge, non-UTF-8-ish and garbage actions give an
  observation or a terminated/truncated step, never an exception;
* ``prefix-preserving``: rendering the conversation with the model's chat template
  after turn k is a token prefix of the rendering after turn k+1.

:func:`tool_sandboxes` is not a rule but a report: for each tool of the env that runs
model-written code (marked by :func:`agentrl.sandbox.mark_tool`), the sandbox mode it
runs in on this machine, or why it refuses to run here.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import random
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from agentrl.chat import as_messages
from agentrl.env import load_env_plugins, make_env, supports_state
from agentrl.errors import ConfigError
from agentrl.sandbox import (
    DESCRIPTIONS,
    Mechanism,
    SandboxUnavailableError,
    resolve,
    tool_policy,
)

SCRIPT = ("", "Answer: 1", "I think the answer is 42.", "up", "Answer: 0", "left")
BAD_ACTIONS = (
    "",
    "x" * 100_000,
    "\udcff\x00\ufffd\U0010ffff",
    "\x07\x1b[2J" * 50,
    "<tool_call>{broken",
    "Answer: " + "9" * 5000,
)


@dataclasses.dataclass(frozen=True, slots=True)
class RuleResult:
    rule: str
    passed: bool
    detail: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class ToolSandbox:
    """The sandbox mode one tool that runs model-written code gets on this machine."""

    tool: str
    mechanism: Mechanism | None
    """None: the tool's policy refuses to run here (``detail`` says what to install)."""
    detail: str


class EnvCheckError(AssertionError):
    """An env broke one or more rules; ``results`` says which and why."""

    def __init__(self, results: list[RuleResult]) -> None:
        self.results = results
        failed = [r for r in results if not r.passed]
        super().__init__("; ".join(f"[{r.rule}] {r.detail}" for r in failed))


def _record(env: gym.Env[Any, Any], action: str) -> tuple[Any, float, bool, bool]:
    obs, reward, terminated, truncated, _ = env.step(action)
    return (obs, float(reward), bool(terminated), bool(truncated))


def _ended(transcript: list[Any]) -> bool:
    return len(transcript) > 1 and (transcript[-1][2] or transcript[-1][3])


def _factory(env: Any, kwargs: Mapping[str, Any]) -> Callable[[], gym.Env[Any, Any]]:
    """Fresh instances of ``env`` (an id, a factory, or an instance) for each check;
    ``kwargs`` go to an id's constructor."""
    if isinstance(env, str):
        load_env_plugins()
        if env not in gym.registry:
            known = sorted(k for k in gym.registry if k.startswith("agentrl/"))
            raise ConfigError(
                f"env id {env!r} is not registered; shipped envs: {known}. For your own env, "
                f"import the module that registers it first (agentrl check-env ID --import "
                f"MODULE_OR_FILE)"
            )
        return lambda: make_env(env, **kwargs)
    if callable(env) and not isinstance(env, gym.Env):
        return env
    spec = getattr(env, "spec", None)
    if spec is not None and spec.id in gym.registry:
        return lambda: gym.make(spec)
    try:  # an instance built by hand (e.g. from_gym("Taxi-v4")): copy it untouched
        pristine = copy.deepcopy(env)
    except Exception as e:
        raise ConfigError(
            f"check_env cannot copy this {type(env).__name__} instance ({type(e).__name__}: "
            f"{e}); pass a zero-argument factory instead, e.g. check_env(lambda: MyEnv(...))"
        ) from None
    return lambda: copy.deepcopy(pristine)


def check_env(
    env: str | gym.Env[Any, Any] | Callable[[], gym.Env[Any, Any]],
    *,
    tokenizer: Any = None,
    raise_on_failure: bool = True,
    example_actions: Sequence[str] = (),
    kwargs: Mapping[str, Any] | None = None,
) -> list[RuleResult]:
    """Run every rule on an env id, instance or factory; raise :class:`EnvCheckError`.

    Args:
        env: an id registered with Gymnasium, an env, or a zero-argument factory.
        tokenizer: a transformers tokenizer with a chat template for the
            prefix-preserving rule; defaults to the tiny model's.
        raise_on_failure: raise if any rule failed (else just return the results).
        example_actions: moves the env accepts (``"reveal 3 4"``); the determinism and
            isolation rules explore from them, besides the env's ``example_actions``.
        kwargs: keyword arguments for the constructor of an env given by id.
    """
    make = _factory(env, kwargs or {})
    examples = lambda: _examples(make, example_actions)  # noqa: E731  (inside each rule)
    rules: list[tuple[str, Callable[[], str | None]]] = [
        ("gymnasium", lambda: _gymnasium(make)),
        ("seeded-determinism", lambda: _determinism(make, examples())),
        ("isolation", lambda: _isolation(make, examples())),
        ("state-round-trip", lambda: _state_round_trip(make)),
        ("robust-actions", lambda: _robust_actions(make)),
        ("prefix-preserving", lambda: _prefix_preserving(make, tokenizer)),
    ]
    results = []
    for name, rule in rules:
        try:
            problem = rule()
        except Exception as e:
            problem = f"raised {type(e).__name__}: {e}"
        results.append(RuleResult(name, problem is None, problem or "ok"))
    if raise_on_failure and not all(r.passed for r in results):
        raise EnvCheckError(results)
    return results


def tool_sandboxes(
    env: str | gym.Env[Any, Any] | Callable[[], gym.Env[Any, Any]],
) -> list[ToolSandbox]:
    """The sandbox mode of each tool of ``env`` that runs model-written code (none for an
    env without such tools). Probes the mechanisms once per process."""
    instance = _factory(env, {})()
    try:
        tools = tuple(getattr(instance.unwrapped, "tools", ()) or ())
    finally:
        instance.close()
    found = []
    for tool in tools:
        policy = tool_policy(tool)
        if policy is None:
            continue
        name = getattr(tool, "name", None) or getattr(tool, "__name__", repr(tool))
        try:
            mechanism = resolve(policy)
        except SandboxUnavailableError as e:
            found.append(ToolSandbox(name, None, f"refuses to run here: {e}"))
            continue
        found.append(ToolSandbox(name, mechanism, f"{mechanism}: {DESCRIPTIONS[mechanism]}"))
    return found


def _gymnasium(make: Callable[[], gym.Env[Any, Any]]) -> str | None:
    from gymnasium.utils.env_checker import check_env as gym_check

    env = make()
    try:
        gym_check(env.unwrapped, skip_render_check=True)
    except AssertionError as e:
        return f"gymnasium's env checker failed: {e}"
    finally:
        env.close()
        env.close()  # close() must be safe twice
    return None


_WORD = re.compile(r"[A-Za-z][A-Za-z_-]{1,15}|\d{1,6}")
EXPLORE_SEEDS = (7, 11, 23)
EXPLORE_STEPS = 12


def _candidates(env: gym.Env[Any, Any], obs: Any) -> list[str]:
    """Actions worth trying now: the script, an adapter's action names, and the words and
    numbers the observation mentions (where an env says what it accepts)."""
    text = json.dumps(obs) if not isinstance(obs, str) else obs
    names = list(getattr(env.unwrapped, "action_names", ()) or ())
    words = list(dict.fromkeys(_WORD.findall(text)))[:40]
    return [*SCRIPT, *names, *words, *(f"Answer: {w}" for w in words if w.isdigit())]


def _examples(make: Callable[[], gym.Env[Any, Any]], given: Sequence[str]) -> tuple[str, ...]:
    """The example actions given, then the env's own ``example_actions``."""
    env = make()
    try:
        own = getattr(env.unwrapped, "example_actions", ()) or ()
    finally:
        env.close()
    if isinstance(own, str) or not all(isinstance(a, str) for a in own):
        raise ConfigError(
            f"{type(env.unwrapped).__name__}.example_actions = {own!r:.80}; "
            "give a list of action strings"
        )
    return tuple(dict.fromkeys([*([given] if isinstance(given, str) else given), *own]))


_NUMBER = re.compile(r"\d+")


def _from_example(chooser: random.Random, examples: Sequence[str], obs: Any) -> str:
    """An example action, each of its numbers kept or changed to one worth trying."""
    text = json.dumps(obs) if not isinstance(obs, str) else obs
    numbers = [*map(str, range(10)), *_NUMBER.findall(text)[:20]]
    return _NUMBER.sub(
        lambda m: m.group() if chooser.random() < 0.3 else chooser.choice(numbers),
        chooser.choice(examples),
    )


def _explore(
    make: Callable[[], gym.Env[Any, Any]], seed: int, examples: Sequence[str] = ()
) -> tuple[list[Any], list[str]]:
    """One episode under actions drawn (by a local RNG) from :func:`_candidates`, and
    half of them from ``examples`` (:func:`_from_example`) when there are any."""
    chooser = random.Random(seed)
    env = make()
    try:
        obs = env.reset(seed=seed)[0]
        transcript: list[Any] = [obs]
        actions: list[str] = []
        while len(actions) < EXPLORE_STEPS and not _ended(transcript):
            if examples and chooser.random() < 0.5:
                action = _from_example(chooser, examples, obs)
            else:
                action = chooser.choice(_candidates(env, obs))
            actions.append(action)
            step = _record(env, action)
            obs = step[0]
            transcript.append(step)
        return transcript, actions
    finally:
        env.close()


@contextlib.contextmanager
def _global_rngs(seed: int) -> Iterator[None]:
    """Put ``random`` and ``numpy.random`` in a chosen state; give the caller's back."""
    saved = random.getstate(), np.random.get_state()
    random.seed(seed)
    np.random.seed(seed)
    try:
        yield
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])


def _stir() -> None:
    """Move the process-wide RNGs on, as other episodes in the same process would."""
    random.random()
    np.random.random()


def _replay(env: gym.Env[Any, Any], seed: int, actions: Sequence[str]) -> list[Any]:
    transcript: list[Any] = [env.reset(seed=seed)[0]]
    for action in actions:
        if _ended(transcript):
            break
        _stir()
        transcript.append(_record(env, action))
    return transcript


_GLOBAL_RNG_HINT = (
    "the env likely draws from process-wide state such as the `random` module or "
    "numpy's global RNG (at reset or at step time): draw from self.np_random instead, "
    "which reset(seed=...) seeds per instance"
)


def _determinism(make: Callable[[], gym.Env[Any, Any]], examples: Sequence[str]) -> str | None:
    for seed in EXPLORE_SEEDS:
        with _global_rngs(1):
            first, actions = _explore(make, seed, examples)
        with _global_rngs(2):
            env = make()
            try:
                second = _replay(env, seed, actions)
            finally:
                env.close()
        if first != second:
            at = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
            where = "reset" if at == 0 else f"step {at} (action {actions[at - 1]!r:.40})"
            return (
                f"seed {seed} with the same actions gave two different episodes, first at "
                f"{where}: {first[at]!r:.120} vs {second[at]!r:.120}; {_GLOBAL_RNG_HINT}"
            )
    return None


def _isolation(make: Callable[[], gym.Env[Any, Any]], examples: Sequence[str]) -> str | None:
    for seed_a, seed_b in ((1, 2), (3, 4), (5, 6)):
        with _global_rngs(0):
            alone_a, acts_a = _explore(make, seed_a, examples)
            alone_b, acts_b = _explore(make, seed_b, examples)
        with _global_rngs(12345):
            got_a, got_b = _interleaved(make, (seed_a, acts_a), (seed_b, acts_b))
        if (got_a, got_b) != (alone_a, alone_b):
            return (
                f"two instances stepped in turn (seeds {seed_a} and {seed_b}) did not "
                f"reproduce their episodes run alone; {_GLOBAL_RNG_HINT}"
            )
    return None


def _interleaved(
    make: Callable[[], gym.Env[Any, Any]], *plans: tuple[int, list[str]]
) -> list[list[Any]]:
    envs = [make() for _ in plans]
    try:
        got = [[env.reset(seed=seed)[0]] for env, (seed, _) in zip(envs, plans, strict=True)]
        for i in range(max(len(actions) for _, actions in plans)):
            for env, transcript, (_, actions) in zip(envs, got, plans, strict=True):
                if i < len(actions) and not _ended(transcript):
                    _stir()
                    transcript.append(_record(env, actions[i]))
        return got
    finally:
        for env in envs:
            env.close()


def _state_round_trip(make: Callable[[], gym.Env[Any, Any]]) -> str | None:
    env = make()
    if not supports_state(env):
        return None
    env.reset(seed=3)
    env.step(SCRIPT[2])
    state = env.unwrapped.get_state()
    try:
        restored_state = json.loads(json.dumps(state))
    except (TypeError, ValueError) as e:
        return f"get_state() returned something that is not JSON-serialisable: {e}"
    # Compare the unwrapped envs: the state is the env's own, not a wrapper's step count.
    expected = env.unwrapped.step(SCRIPT[1])[:4]
    other = make()
    other.reset(seed=99)
    other.unwrapped.set_state(restored_state)
    got = other.unwrapped.step(SCRIPT[1])[:4]
    if got != expected:
        return (
            f"after set_state(get_state()) the same action gave {got!r:.200}, "
            f"expected {expected!r:.200}"
        )
    return None


def _robust_actions(make: Callable[[], gym.Env[Any, Any]]) -> str | None:
    for action in BAD_ACTIONS:
        env = make()
        env.reset(seed=0)
        try:
            obs, _, terminated, truncated, info = env.step(action)
        except Exception as e:
            return (
                f"step({action[:30]!r}...) raised {type(e).__name__}: {e}; expected an "
                f"observation or a terminated/truncated step with info['reason']"
            )
        if not (terminated or truncated) and not env.observation_space.contains(obs):
            return (
                f"step({action[:30]!r}...) returned an observation outside the "
                f"observation space: {obs!r:.100}"
            )
        if not isinstance(info, dict):
            return f"step() returned info of type {type(info).__name__}, expected a dict"
    return None


def _prefix_preserving(make: Callable[[], gym.Env[Any, Any]], tokenizer: Any) -> str | None:
    if tokenizer is None:
        from transformers import AutoTokenizer

        from agentrl.models.tiny import build_tiny_model

        tokenizer = AutoTokenizer.from_pretrained(build_tiny_model())
    env = make()
    inner = env.unwrapped
    obs, _ = env.reset(seed=5)
    messages: list[dict[str, Any]] = []
    if getattr(inner, "system_prompt", None):
        messages.append({"role": "system", "content": inner.system_prompt})
    messages += as_messages(obs)

    def render() -> list[int]:
        return tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]

    previous: list[int] | None = None
    for action in SCRIPT[1:4]:
        ids = render()
        if previous is not None and ids[: len(previous)] != previous:
            return (
                "the chat template re-renders earlier turns differently once a turn is "
                "added; use a prefix-preserving template"
            )
        previous = ids
        messages.append({"role": "assistant", "content": action})
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            break
        messages += as_messages(obs)
    ids = render()
    if previous is not None and ids[: len(previous)] != previous:
        return (
            "the last turn changed the rendering of earlier turns; use a prefix-preserving template"
        )
    return None

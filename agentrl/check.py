"""``check_env``: Gymnasium's checker plus the rules LLM environments need.

Rules, each reported by name with what the env did and what was expected:

* ``gymnasium``: ``gymnasium.utils.env_checker.check_env`` passes;
* ``seeded-determinism``: the same seed gives the same episode;
* ``isolation``: two interleaved instances with different seeds give the same
  episodes as each alone (catches envs that use the process-wide ``random``);
* ``state-round-trip``: ``get_state`` is JSON-serialisable and ``set_state`` of it
  continues the episode identically (only for envs that implement both);
* ``robust-actions``: empty, huge, non-UTF-8-ish and garbage actions give an
  observation or a terminated/truncated step, never an exception;
* ``prefix-preserving``: rendering the conversation with the model's chat template
  after turn k is a token prefix of the rendering after turn k+1.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from agentrl.env import make_env, supports_state

SCRIPT = ("", "Answer: 1", "I think the answer is 42.", "up", "Answer: 0", "left")
BAD_ACTIONS = ("", "x" * 100_000, "\udcff\x00\ufffd\U0010ffff", "\x07\x1b[2J" * 50,
               "<tool_call>{broken", "Answer: " + "9" * 5000)  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class RuleResult:
    rule: str
    passed: bool
    detail: str = ""


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


def _episode(env: gym.Env[Any, Any], seed: int) -> list[Any]:
    transcript: list[Any] = [env.reset(seed=seed)[0]]
    for action in SCRIPT:
        if _ended(transcript):
            break
        transcript.append(_record(env, action))
    return transcript


def _factory(env: Any) -> Callable[[], gym.Env[Any, Any]]:
    if isinstance(env, str):
        return lambda: make_env(env)
    if callable(env) and not isinstance(env, gym.Env):
        return env
    spec = getattr(env, "spec", None)
    if spec is not None:
        return lambda: gym.make(spec.id)
    return lambda: type(env.unwrapped)()


def check_env(
    env: str | gym.Env[Any, Any] | Callable[[], gym.Env[Any, Any]],
    *,
    tokenizer: Any = None,
    raise_on_failure: bool = True,
) -> list[RuleResult]:
    """Run every rule on an env id, instance or factory; raise :class:`EnvCheckError`.

    Args:
        env: an id registered with Gymnasium, an env, or a zero-argument factory.
        tokenizer: a transformers tokenizer with a chat template for the
            prefix-preserving rule; defaults to the tiny model's.
        raise_on_failure: raise if any rule failed (else just return the results).
    """
    make = _factory(env)
    rules: list[tuple[str, Callable[[], str | None]]] = [
        ("gymnasium", lambda: _gymnasium(make)),
        ("seeded-determinism", lambda: _determinism(make)),
        ("isolation", lambda: _isolation(make)),
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


def _determinism(make: Callable[[], gym.Env[Any, Any]]) -> str | None:
    first, second = _episode(make(), seed=7), _episode(make(), seed=7)
    if first != second:
        return f"seed 7 gave two different episodes: {first!r:.200} vs {second!r:.200}"
    return None


def _isolation(make: Callable[[], gym.Env[Any, Any]]) -> str | None:
    random.seed(0)
    alone_a, alone_b = _episode(make(), 1), _episode(make(), 2)
    random.seed(12345)
    a, b = make(), make()
    got_a, got_b = [a.reset(seed=1)[0]], [b.reset(seed=2)[0]]
    for action in SCRIPT:
        for env, got in ((a, got_a), (b, got_b)):
            if not _ended(got):
                got.append(_record(env, action))
    if (got_a, got_b) != (alone_a, alone_b):
        return (
            "two instances stepped in turn (seeds 1 and 2) did not reproduce their "
            "episodes run alone; the env likely uses process-wide state such as the "
            "`random` module: draw from self.np_random instead"
        )
    return None


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
    messages += _as_messages(obs)

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
        messages += _as_messages(obs)
    ids = render()
    if previous is not None and ids[: len(previous)] != previous:
        return (
            "the last turn changed the rendering of earlier turns; use a prefix-preserving template"
        )
    return None


def _as_messages(obs: Any) -> list[dict[str, Any]]:
    return obs if isinstance(obs, list) else [{"role": "user", "content": obs}]

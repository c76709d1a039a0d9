"""The adapter for existing Gymnasium envs and 5-tuple look-alikes."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import pytest

from agentrl import check_env
from agentrl.adapter import GymTextAdapter, ansi_to_text, from_gym


def test_frozen_lake_is_playable_from_text() -> None:
    env = from_gym("FrozenLake-v1", is_slippery=False)
    obs, _ = env.reset(seed=0)
    assert "[S]FFF" in obs and "hole" in obs and "left, down, right, up" in obs
    # Map 4x4: SFFF / FHFH / FFFH / HFFG. Safe path: down down right right down right.
    replies = ["down", "Let me go down.", "right", "2", "DOWN!", "then right"]
    for i, reply in enumerate(replies):
        obs, reward, terminated, truncated, _ = env.step(reply)
        if i == 2:
            fork = from_gym("FrozenLake-v1", is_slippery=False)
            fork.reset(seed=5)
            fork.set_state(env.get_state())
            assert fork.render() == env.render()
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert "[G]" in obs


def test_reply_without_an_action_gets_a_hint_then_truncates() -> None:
    env = from_gym("FrozenLake-v1", is_slippery=False)
    env.reset(seed=0)
    obs, _, terminated, truncated, info = env.step("hmm, not sure")
    assert "could not find an action" in obs and "[S]" in obs and not truncated
    env.step("???")
    _, _, terminated, truncated, info = env.step("")
    assert truncated and not terminated and "no action" in info["reason"]


class LookAlike:
    """Follows Gymnasium's 5-tuple API without subclassing gymnasium.Env."""

    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: Any = None):
        self.position = int(seed or 0) % 3
        return self.position, {}

    def step(self, action: int):
        self.position += 1 if action == 1 else -1
        done = self.position >= 5
        return self.position, float(done), done, self.position < -3, {}


def test_a_look_alike_env_is_wrapped_and_passes_the_checks() -> None:
    make = lambda: GymTextAdapter(LookAlike(), action_names=["back", "forward"])  # noqa: E731
    env = make()
    obs, _ = env.reset(seed=1)
    assert "back, forward" in obs
    while True:
        obs, reward, terminated, truncated, _ = env.step("forward")
        if terminated or truncated:
            break
    assert (obs, reward, terminated) == ("5", 1.0, True)
    assert all(r.passed for r in check_env(make))


def test_clear_errors_for_what_the_adapter_cannot_wrap() -> None:
    class OldApi(LookAlike):
        def step(self, action: int):
            return 0, 0.0, False, {}

    env = GymTextAdapter(OldApi())
    env.reset(seed=0)
    with pytest.raises(TypeError, match=r"4-tuple; expected \(obs, reward, terminated"):
        env.step("1")
    with pytest.raises(TypeError, match="not Discrete; pass parse_action"):
        GymTextAdapter(gym.make("Pendulum-v1"))
    with pytest.raises(TypeError, match="has no reset"):
        GymTextAdapter(object())
    with pytest.raises(ValueError, match=r"3 action_names for a Discrete\(2\)"):
        GymTextAdapter(LookAlike(), action_names=["a", "b", "c"])


def test_continuous_actions_through_parse_action() -> None:
    def parse(text: str) -> Any:
        try:
            return [max(-2.0, min(2.0, float(text.split()[-1])))]
        except (ValueError, IndexError):
            return None

    env = GymTextAdapter(gym.make("Pendulum-v1"), parse_action=parse)
    obs, _ = env.reset(seed=0)
    assert obs.startswith("[")  # str() of the observation array
    _, reward, _, _, _ = env.step("torque 1.5")
    assert reward < 0


def test_ansi_highlights_become_visible_markers() -> None:
    text = "|\x1b[35m\x1b[43mY\x1b[0m\x1b[0m| \x1b[34;1mB\x1b[0m \x1b[35mR\x1b[0m \x1b[32mX\x1b[0m"
    assert ansi_to_text(text) == "|{[Y]}| (B) {R} *X*"


class _SeedOnly:
    """A look-alike whose reset takes only ``seed`` (no options), as many do."""

    def __init__(self) -> None:
        self.action_space = gym.spaces.Discrete(2)
        self.value = 0

    def reset(self, seed: int | None = None) -> tuple[int, dict[str, Any]]:
        import random as stdlib_random

        self.value = stdlib_random.Random(seed).randint(0, 9)
        return self.value, {}

    def step(self, action: int) -> tuple[int, float, bool, bool, dict[str, Any]]:
        self.value += 1 if action else -1
        return self.value, float(self.value == 5), self.value == 5, False, {}


class _PositionalSeed(_SeedOnly):
    def reset(self, seed, /):  # type: ignore[override]
        return super().reset(seed=seed)


class _OldGym(_SeedOnly):
    """Gym < 0.26: ``seed(n)`` then ``reset()`` (still returning (obs, info) here)."""

    def seed(self, n: int) -> None:
        self._next = n

    def reset(self):  # type: ignore[override]
        return super().reset(seed=self._next)


@pytest.mark.parametrize("cls", [_SeedOnly, _PositionalSeed, _OldGym])
def test_look_alikes_with_other_reset_signatures_are_seeded_and_replayable(cls: type) -> None:
    env = GymTextAdapter(cls(), action_names=["down", "up"])
    first, _ = env.reset(seed=3)
    again, _ = GymTextAdapter(cls(), action_names=["down", "up"]).reset(seed=3)
    assert first == again  # the seed reached the inner env
    env.step("up")
    state = env.get_state()
    fork = GymTextAdapter(cls(), action_names=["down", "up"])
    fork.reset(seed=9)
    fork.set_state(state)
    assert fork.render() == env.render()
    with pytest.raises(TypeError, match="takes no options"):  # said, not silently dropped
        env.reset(seed=1, options={"level": 2})

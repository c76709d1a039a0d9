"""The env contract: text spaces pass Gymnasium's checker; envs register with Gymnasium."""

from __future__ import annotations

import gymnasium as gym
from gymnasium.utils.env_checker import check_env as gym_check_env

from agentrl.env import MessagesSpace, TextSpace, make_env, supports_state


def test_text_space_accepts_real_text() -> None:
    space = TextSpace(80)
    assert space.contains('What is 3 + 4? Use <tool_call>{"x": 1}</tool_call> ü')
    assert not space.contains("x" * 81) and not space.contains(b"bytes")
    assert space.contains(space.sample())
    messages = MessagesSpace()
    assert messages.contains([{"role": "user", "content": "hi"}])
    assert not messages.contains([{"role": "robot", "content": "hi"}])
    assert messages.contains(messages.sample())


def test_calculator_env_registers_and_passes_gymnasium_checker() -> None:
    env = make_env("agentrl/Calculator-v0")
    gym_check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=3)
    assert obs.startswith("What is") and info["target"] == env.unwrapped.target
    assert supports_state(env)
    _, reward, terminated, truncated, info = env.step(f"Answer: {env.unwrapped.target}")
    assert (reward, terminated, truncated) == (1.0, True, False)
    env.reset(seed=3)
    _, reward, terminated, _, info = env.step("no idea")
    assert reward == 0.0 and terminated and "Answer" in info["reason"]
    env.close()
    env.close()
    assert gym.spec("agentrl/Calculator-v0").entry_point == "envs.calculator:CalculatorEnv"

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


def test_env_threads_reaching_make_env_at_once_scan_the_plugins_once(monkeypatch) -> None:
    """A run's first episodes build their envs on many threads at once: one scan of the
    entry points, and no thread goes on before the plugin that registers its id is in."""
    import importlib.metadata
    import threading
    import time

    import agentrl.env.registry as env_module

    env_id = "user/PluginScanned-v0"
    scans: list[int] = []

    class SlowPlugin:  # an entry point whose module takes a while to import
        value = "tests.slow_plugin_module"

        def load(self) -> None:
            time.sleep(0.2)
            env_module.register_env(env_id, "envs.guess_number:GuessNumberEnv")

    def entry_points(group: str) -> list[SlowPlugin]:
        assert group == env_module.ENV_ENTRY_POINTS
        scans.append(1)
        return [SlowPlugin()]

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    monkeypatch.setattr(env_module, "_plugins_scanned", False)
    monkeypatch.setattr(env_module, "_loaded_plugins", set())
    gym.registry.pop(env_id, None)
    made, failed = [], []
    start = threading.Barrier(16)

    def build() -> None:
        start.wait()
        try:
            made.append(make_env(env_id))
        except Exception as e:  # an id not registered yet
            failed.append(e)

    threads = [threading.Thread(target=build) for _ in range(16)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        gym.registry.pop(env_id, None)
    assert failed == [] and len(made) == 16
    assert len(scans) == 1

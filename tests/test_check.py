"""check_env on shipped envs, on an env written outside the repo, and on a broken env."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentrl import check_env
from agentrl.check import EnvCheckError

EXTERNAL_ENV = textwrap.dedent(
    """
    import gymnasium as gym
    from agentrl.env import TextEnv, register_env

    class EchoEnv(TextEnv):
        \"\"\"Say the secret word back; three tries.\"\"\"

        system_prompt = "Repeat the word you are given."

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.word = ["apple", "river", "stone"][int(self.np_random.integers(3))]
            self.tries = 0
            return f"Say: {self.word}", {}

        def step(self, action):
            self.tries += 1
            if self.word in action:
                return "", 1.0, True, False, {"reason": "said it"}
            return "Not quite, try again.", 0.0, False, self.tries >= 3, {}

        def get_state(self):
            return {"word": self.word, "tries": self.tries}

        def set_state(self, state):
            self.word, self.tries = state["word"], state["tries"]

    register_env("{env_id}", EchoEnv)
    """
)

BROKEN_ENV = EXTERNAL_ENV.replace(
    'self.word = ["apple", "river", "stone"][int(self.np_random.integers(3))]',
    'import random; self.word = random.choice(["apple", "river", "stone"])',
).replace("if self.word in action:", "if action.encode('ascii') and self.word in action:")


def _load(tmp_path: Path, source: str, env_id: str) -> Path:
    path = tmp_path / f"{env_id.replace('/', '_')}.py"
    path.write_text(source.replace("{env_id}", env_id))
    return path


def test_shipped_calculator_env_passes_every_rule() -> None:
    results = check_env("agentrl/Calculator-v0")
    assert [r.rule for r in results if r.passed] == [r.rule for r in results]
    assert len(results) == 6


def test_env_written_outside_the_repo_registers_and_passes(tmp_path: Path) -> None:
    import runpy

    runpy.run_path(str(_load(tmp_path, EXTERNAL_ENV, "external/Echo-v0")))
    assert all(r.passed for r in check_env("external/Echo-v0"))
    assert len(EXTERNAL_ENV.strip().splitlines()) <= 32


def test_broken_env_fails_named_rules(tmp_path: Path) -> None:
    import runpy

    runpy.run_path(str(_load(tmp_path, BROKEN_ENV, "external/Broken-v0")))
    with pytest.raises(EnvCheckError) as info:
        check_env("external/Broken-v0")
    failed = {r.rule: r.detail for r in info.value.results if not r.passed}
    assert "robust-actions" in failed and "UnicodeEncodeError" in failed["robust-actions"]
    assert "seeded-determinism" in failed or "isolation" in failed


def test_cli_check_env_exits_non_zero_and_names_the_rule(tmp_path: Path) -> None:
    path = _load(tmp_path, BROKEN_ENV, "external/BrokenCli-v0")
    cli = [sys.executable, "-m", "agentrl.cli", "check-env", "external/BrokenCli-v0"]
    out = subprocess.run([*cli, "--import", str(path)], capture_output=True, text=True)
    assert out.returncode == 1, out.stderr
    assert "FAIL  robust-actions" in out.stdout and "rule(s) failed" in out.stdout
    ok = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "check-env", "agentrl/Calculator-v0"],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0 and "all rules passed" in ok.stdout, ok.stdout + ok.stderr


STEP_TIME_RANDOM_ENV = textwrap.dedent(
    """
    import random
    from agentrl.env import TextEnv, register_env

    class DiceEnv(TextEnv):
        \"\"\"Roll until you see a six. Seeded at reset; the die itself is the global one.\"\"\"

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.rolls = 0
            return "Say roll to roll the die, or stop to stop.", {}

        def step(self, action):
            if "roll" not in action:
                return "Say roll or stop.", 0.0, "stop" in action, False, {}
            self.rolls += 1
            face = random.randint(1, 6)          # step-time draw from the global RNG
            return f"You rolled {face}.", float(face == 6), face == 6, self.rolls >= 5, {}

    register_env("{env_id}", DiceEnv)
    """
)


def test_an_env_drawing_from_global_random_at_step_time_is_flagged(tmp_path: Path) -> None:
    """The fixed script never says "roll"; exploring the words the env offers does."""
    import runpy

    runpy.run_path(str(_load(tmp_path, STEP_TIME_RANDOM_ENV, "external/Dice-v0")))
    results = {r.rule: r for r in check_env("external/Dice-v0", raise_on_failure=False)}
    assert not results["seeded-determinism"].passed, results["seeded-determinism"]
    assert "random" in results["seeded-determinism"].detail
    assert not results["isolation"].passed
    assert results["robust-actions"].passed and results["gymnasium"].passed


def test_instances_are_accepted_including_adapter_envs() -> None:
    import agentrl

    taxi = agentrl.from_gym("Taxi-v4")
    results = check_env(taxi, raise_on_failure=False)
    failed = {r.rule: r.detail for r in results if not r.passed}
    assert failed == {}, failed
    from agentrl.env import make_env

    registered = make_env("agentrl/GuessNumber-v0")
    assert all(r.passed for r in check_env(registered))


def test_an_unknown_id_is_one_clear_error() -> None:
    from agentrl.errors import ConfigError

    with pytest.raises(ConfigError, match="not registered"):
        check_env("nope/Missing-v0")
    out = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "check-env", "nope/Missing-v0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1
    assert out.stdout == ""
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "nope/Missing-v0" in lines[0] and "--import" in lines[0], lines


MINES = str(Path(__file__).with_name("mines_env.py"))


@pytest.mark.timeout(120)
def test_a_step_time_draw_reached_only_through_example_actions_is_flagged() -> None:
    """Moves are "reveal R C"; the explorer alone never makes one, so the draw at the
    first reveal is not seen. Example actions (given, or the env's own) reach it."""
    import runpy

    runpy.run_path(MINES)
    alone = {r.rule: r for r in check_env("user/Mines-v0", raise_on_failure=False)}
    assert alone["seeded-determinism"].passed and alone["isolation"].passed  # the blind spot
    for results in (
        check_env("user/Mines-v0", raise_on_failure=False, example_actions=["reveal 1 2"]),
        check_env("user/MinesExamples-v0", raise_on_failure=False),  # its example_actions
    ):
        rules = {r.rule: r for r in results}
        assert not rules["seeded-determinism"].passed, rules["seeded-determinism"]
        assert "random" in rules["seeded-determinism"].detail
        assert "reveal" in rules["seeded-determinism"].detail  # the move that differed
        assert not rules["isolation"].passed
        assert rules["robust-actions"].passed and rules["gymnasium"].passed


@pytest.mark.timeout(120)
def test_cli_example_actions_and_kwargs() -> None:
    cli = [sys.executable, "-m", "agentrl.cli", "check-env"]
    out = subprocess.run(
        [*cli, "user/Mines-v0", "--import", MINES, "--example-action", "reveal 0 0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAIL  seeded-determinism" in out.stdout
    ok = subprocess.run(
        [
            *cli,
            "agentrl/GuessNumber-v0",
            "--kwargs",
            '{"high": 30}',
            "--example-action",
            "Guess: 7",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0 and "all rules passed" in ok.stdout, ok.stdout + ok.stderr

"""The guess-number warm start's demonstrations are solved episodes of the real env."""

from __future__ import annotations

import random
import re

from envs.guess_number import GuessNumberEnv
from examples.guess_number.demonstrations import demonstrations, noisy_guess

KWARGS = {"low": 1, "high": 30, "max_guesses": 6}


def test_demonstrations_replay_as_solved_episodes() -> None:
    demos = demonstrations(40, 0.6, **KWARGS)
    assert len(demos) == 40
    env = GuessNumberEnv(**KWARGS)
    for demo in demos:
        env.reset(seed=0)
        env.set_state({"secret": _secret(demo), "guesses": 0})
        turns = [m["content"] for m in demo if m["role"] == "assistant"]
        low, high = 0, 31
        for i, text in enumerate(turns):
            got = re.fullmatch(r"Between (\d+) and (\d+)\. Guess: (\d+)", text)
            assert got, text
            assert (int(got[1]), int(got[2])) == (low, high)  # the interval still open
            guess = int(got[3])
            assert low < guess < high
            reply, reward, terminated, truncated, _ = env.step(text)
            if i == len(turns) - 1:
                assert terminated and reward == 1.0 and not truncated
            else:
                assert reply == demo[3 + 2 * i]["content"]
                low, high = (guess, high) if reply == "Higher." else (low, guess)
        assert len(turns) <= KWARGS["max_guesses"]


def test_noisy_guess_stays_inside_and_centres_on_the_midpoint() -> None:
    rng = random.Random(0)
    guesses = [noisy_guess(0, 31, 0.6, rng) for _ in range(2000)]
    assert all(0 < g < 31 for g in guesses)
    assert abs(sum(guesses) / len(guesses) - 15.5) < 0.5
    near = sum(11 <= g <= 20 for g in guesses) / len(guesses)
    assert near > 1 / 3 + 0.05  # the middle ten of thirty, guessed more often than uniform
    assert [noisy_guess(4, 6, 0.6, rng) for _ in range(20)] == [5] * 20


def _secret(demo: list) -> int:
    return int(re.findall(r"\d+", demo[-1]["content"])[-1])


def test_off_centre_guesses_aim_at_their_fraction_of_the_interval() -> None:
    rng = random.Random(1)
    guesses = [noisy_guess(0, 31, 0.3, rng, centre=0.2) for _ in range(2000)]
    assert all(0 < g < 31 for g in guesses)
    # 0.2 of the way from 0 to 31 is 6.2; keeping the guesses above 0 lifts the mean a little
    assert abs(sum(guesses) / len(guesses) - 6.6) < 0.6
    demos = demonstrations(20, 0.3, centre=0.2, **{**KWARGS, "max_guesses": 8})
    firsts = [int(re.findall(r"\d+", d[2]["content"])[-1]) for d in demos]
    assert sum(firsts) / len(firsts) < 12  # lopsided: bisection's first guess is 15 or 16

"""Synthetic demonstrations of guess-the-number for the SFT warm start: noisy bisection.

Each assistant turn writes the interval still open, then its guess:
``Between 7 and 31. Guess: 18``. The bounds are exclusive and come from the previous
turn by copying (after "Higher." the low bound becomes the last guess, after "Lower."
the high bound does), so a tiny model can track the state without arithmetic. The env
reads the last number of a reply, so the guess is what it scores.

The guess is the interval's midpoint plus Gaussian noise (``noise`` times the
half-width, rounded, kept inside the interval): a reasonable but imperfect strategy
whose most likely guess is bisection's. RL has room to sharpen it: fewer turns, and
more numbers found within the turn budget. Only episodes that found the number are
kept (a demonstration teaches the moves, the env's budget is the caller's).
"""

from __future__ import annotations

import random
from typing import Any

from agentrl.types import Message
from envs.guess_number import GuessNumberEnv

SFT_SEED_BASE = 60_000_000
"""Demonstration episodes use env seeds from here; RL and evaluation use others."""


def turn_text(low: int, high: int, guess: int) -> str:
    """One assistant turn: the open interval (exclusive bounds), then the guess."""
    return f"Between {low} and {high}. Guess: {guess}"


def noisy_guess(low: int, high: int, noise: float, rng: random.Random, centre: float = 0.5) -> int:
    """The point ``centre`` of the way through the open interval (low, high) (0.5: its
    midpoint, bisection) plus ``noise`` half-widths of Gaussian noise, rounded and kept
    strictly inside it."""
    point, half = low + centre * (high - low), (high - low) / 2
    guess = round(point + rng.gauss(0.0, noise) * half)
    return min(max(guess, low + 1), high - 1)


def demonstration(
    env: GuessNumberEnv, seed: int, noise: float, rng: random.Random, centre: float = 0.5
) -> tuple[list[Message], bool]:
    """One episode of ``env`` (reset with ``seed``) played by noisy bisection, as chat
    messages, and whether it found the number within the env's budget."""
    question, _ = env.reset(seed=seed)
    messages: list[Message] = [
        {"role": "system", "content": env.system_prompt},
        {"role": "user", "content": question},
    ]
    low, high = env.low - 1, env.high + 1
    while True:
        guess = noisy_guess(low, high, noise, rng, centre)
        messages.append({"role": "assistant", "content": turn_text(low, high, guess)})
        reply, reward, terminated, truncated, _ = env.step(f"Guess: {guess}")
        if terminated or truncated:
            return messages, reward >= 1.0
        messages.append({"role": "user", "content": reply})
        low, high = (guess, high) if reply.startswith("Higher") else (low, guess)


def demonstrations(
    count: int,
    noise: float,
    *,
    offset: int = 0,
    centre: float = 0.5,
    exclude: frozenset[int] | set[int] = frozenset(),
    **env_kwargs: Any,
) -> list[list[Message]]:
    """``count`` solved episodes by noisy search (bisection when ``centre`` is 0.5);
    secrets in ``exclude`` (the evaluation's) are skipped."""
    env = GuessNumberEnv(**env_kwargs)
    rng = random.Random(offset)
    out: list[list[Message]] = []
    seed = SFT_SEED_BASE + offset
    while len(out) < count:
        messages, solved = demonstration(env, seed, noise, rng, centre)
        seed += 1
        if solved and env.secret not in exclude:
            out.append(messages)
    return out


def secrets(seeds: range, **env_kwargs: Any) -> set[int]:
    """The secret numbers the env draws for these seeds (e.g. the evaluation's)."""
    env = GuessNumberEnv(**env_kwargs)
    out = set()
    for seed in seeds:
        env.reset(seed=seed)
        out.add(env.secret)
    return out

"""Guess the number: multi-turn, with "higher"/"lower" feedback after every guess.

The smallest multi-turn env: no tools, the state is two integers, and the reward is 1
for finding the number within ``max_guesses`` (the episode truncates after that).
"""

from __future__ import annotations

import re
from typing import Any

from agentrl.env import TextEnv

_NUMBER = re.compile(r"-?\d{1,12}")


class GuessNumberEnv(TextEnv):
    system_prompt = "Find the secret number. Reply with 'Guess: N' each turn."

    def __init__(self, low: int = 1, high: int = 100, max_guesses: int = 7) -> None:
        self.low, self.high, self.max_guesses = low, high, max_guesses
        self.secret, self.guesses = low, 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.secret = int(self.np_random.integers(self.low, self.high + 1))
        self.guesses = 0
        return f"I am thinking of a number from {self.low} to {self.high}.", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        numbers = _NUMBER.findall(action)
        if not numbers:  # no guess: say so, and it still costs a turn
            self.guesses += 1
            out_of_turns = self.guesses >= self.max_guesses
            return "Reply with 'Guess: N'.", 0.0, False, out_of_turns, {"reason": "no number"}
        guess = int(numbers[-1])
        self.guesses += 1
        if guess == self.secret:
            return "", 1.0, True, False, {"reason": "found it", "guesses": self.guesses}
        if self.guesses >= self.max_guesses:
            return "", 0.0, False, True, {"reason": f"not found in {self.max_guesses} guesses"}
        return ("Higher." if guess < self.secret else "Lower."), 0.0, False, False, {}

    def get_state(self) -> dict[str, Any]:
        return {"secret": self.secret, "guesses": self.guesses}

    def set_state(self, state: dict[str, Any]) -> None:
        self.secret, self.guesses = int(state["secret"]), int(state["guesses"])

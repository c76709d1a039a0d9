"""A Minesweeper-like user env whose moves need a syntax ("reveal R C") that
check-env's explorer never writes, and whose first reveal places the mines with the
process-wide ``random`` (the bug the checker must find). Registered when imported
(``--import tests/mines_env.py``): ``user/Mines-v0``, and ``user/MinesExamples-v0``,
which lists ``example_actions`` itself."""

from __future__ import annotations

import random
from typing import Any

from agentrl.env import TextEnv, register_env

SIZE = 5


class MinesEnv(TextEnv):
    """Reveal cells without hitting a mine; ten moves."""

    system_prompt = "Reply with one move: reveal R C."

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.mines: set[tuple[int, int]] | None = None
        self.moves = 0
        return f"A {SIZE}x{SIZE} board. Move: reveal R C (rows and columns from zero).", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.moves += 1
        parts = action.split()
        if (
            len(parts) != 3
            or parts[0] != "reveal"
            or not all(p.isdigit() and int(p) < SIZE for p in parts[1:])
        ):
            return "Unknown move.", 0.0, False, self.moves >= 10, {}
        if self.mines is None:  # the bug: placed with the process-wide RNG
            self.mines = {(random.randrange(SIZE), random.randrange(SIZE)) for _ in range(6)}
        r, c = int(parts[1]), int(parts[2])
        if (r, c) in self.mines:
            return "Boom.", 0.0, True, False, {"reason": "mine"}
        near = sum(abs(r - a) <= 1 and abs(c - b) <= 1 for a, b in self.mines)
        return f"{near} mines around.", 0.1, False, self.moves >= 10, {}


class MinesWithExamples(MinesEnv):
    example_actions = ("reveal 2 3",)


register_env("user/Mines-v0", MinesEnv)
register_env("user/MinesExamples-v0", MinesWithExamples)

"""Maze: walk a text gridworld to the goal, one move per turn.

A fresh maze is carved at every reset (randomised depth-first search, seeded by the
env's own generator). The agent sees the grid (``#`` wall, ``.`` floor, ``@`` itself,
``G`` the goal) and replies with a direction. Reward 1 on reaching the goal; the
episode truncates after ``max_moves``. ``get_state`` captures the whole grid and
position, so an episode can be paused, resumed or forked at any turn.
"""

from __future__ import annotations

import re
from typing import Any

from agentrl.env import TextEnv

MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
ALIASES = {"north": "up", "south": "down", "west": "left", "east": "right"}
_DIRECTION = re.compile(r"\b(up|down|left|right|north|south|west|east)\b", re.IGNORECASE)


class MazeEnv(TextEnv):
    system_prompt = "Reach G. Reply with one move each turn: up, down, left or right."

    def __init__(self, width: int = 4, height: int = 4, max_moves: int = 40) -> None:
        self.width, self.height, self.max_moves = width, height, max_moves
        self.grid: list[str] = []
        self.pos = (1, 1)
        self.moves = 0

    @property
    def goal(self) -> tuple[int, int]:
        return (2 * self.height - 1, 2 * self.width - 1)

    def _carve(self) -> list[str]:
        cells = [["#"] * (2 * self.width + 1) for _ in range(2 * self.height + 1)]
        stack, seen = [(0, 0)], {(0, 0)}
        cells[1][1] = "."
        while stack:
            r, c = stack[-1]
            options = [
                (r + dr, c + dc)
                for dr, dc in MOVES.values()
                if 0 <= r + dr < self.height
                and 0 <= c + dc < self.width
                and (r + dr, c + dc) not in seen
            ]
            if not options:
                stack.pop()
                continue
            nr, nc = options[int(self.np_random.integers(len(options)))]
            cells[r + nr + 1][c + nc + 1] = "."  # the wall between the two cells
            cells[2 * nr + 1][2 * nc + 1] = "."
            seen.add((nr, nc))
            stack.append((nr, nc))
        return ["".join(row) for row in cells]

    def _view(self) -> str:
        rows = [list(row) for row in self.grid]
        rows[self.goal[0]][self.goal[1]] = "G"
        rows[self.pos[0]][self.pos[1]] = "@"
        return "\n".join("".join(row) for row in rows)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.grid, self.pos, self.moves = self._carve(), (1, 1), 0
        return f"You are @ in this maze:\n{self._view()}", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.moves += 1
        out_of_moves = self.moves >= self.max_moves
        found = _DIRECTION.findall(action)
        if not found:
            return (
                "Reply with up, down, left or right.",
                0.0,
                False,
                out_of_moves,
                {"reason": "no direction"},
            )
        word = found[-1].lower()
        dr, dc = MOVES[ALIASES.get(word, word)]
        r, c = self.pos[0] + dr, self.pos[1] + dc
        if self.grid[r][c] == "#":
            return f"A wall blocks the way.\n{self._view()}", 0.0, False, out_of_moves, {}
        self.pos = (r, c)
        if self.pos == self.goal:
            return "", 1.0, True, False, {"reason": "reached the goal", "moves": self.moves}
        return self._view(), 0.0, False, out_of_moves, {}

    def get_state(self) -> dict[str, Any]:
        return {"grid": self.grid, "pos": list(self.pos), "moves": self.moves}

    def set_state(self, state: dict[str, Any]) -> None:
        self.grid = [str(row) for row in state["grid"]]
        self.pos = (int(state["pos"][0]), int(state["pos"][1]))
        self.moves = int(state["moves"])

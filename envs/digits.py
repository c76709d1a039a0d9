"""Digits: the smallest learnable task, for smoke runs of the whole training loop.

One turn; the reward is the share of the reply's characters that are digits. A random
tiny model scores about 0.01 and learns it in a dozen RL steps on CPU, so a run that
does not improve here has a bug, not a hard task.
"""

from __future__ import annotations

from typing import Any

from agentrl.env import TextEnv


class DigitsEnv(TextEnv):
    system_prompt = "Reply with digits only."

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        return "Write some digits.", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        text = action.strip()
        share = sum(c.isdigit() for c in text) / len(text) if text else 0.0
        return "", share, True, False, {"reason": f"{share:.0%} digits"}

    def get_state(self) -> dict[str, Any]:
        return {}

    def set_state(self, state: dict[str, Any]) -> None:
        pass

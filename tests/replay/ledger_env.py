"""A user's env, registered only when this file is imported (``--import`` / env.imports).

Its tool changes the env's state: ``transfer`` moves money out of the account, and the
final answer must be the balance after the transfers. ``Ledger-v0`` has
get_state/set_state; ``LedgerNoState-v0`` does not (forks then replay the tool calls).
"""

from __future__ import annotations

import itertools
from typing import Any

from agentrl.env import TextEnv, parse_final_answer, register_env


class LedgerEnv(TextEnv):
    """Transfer some money with the tool, then answer with the balance left."""

    system_prompt = "Use the transfer tool, then reply 'Answer: <balance>'."

    def __init__(self) -> None:
        self.tools = [self.transfer]
        self.balance = 0
        self.turns = 0

    def transfer(self, amount: int) -> str:
        """Move money out of the account.

        Args:
            amount: how much to transfer.
        """
        self.balance -= amount
        return f"transferred {amount}; balance {self.balance}"

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.balance, self.turns = 100 + int(self.np_random.integers(50)), 0
        return f"Your balance is {self.balance}. Transfer 30, then say the balance.", {}

    def step(self, action: str):
        self.turns += 1
        answer = parse_final_answer(action)
        if answer is not None:
            right = answer == self.balance
            return "", float(right), True, False, {"reason": "right" if right else "wrong"}
        return "Say 'Answer: <balance>'.", 0.0, False, self.turns >= 4, {}

    def get_state(self) -> dict[str, Any]:
        return {"balance": self.balance, "turns": self.turns}

    def set_state(self, state: dict[str, Any]) -> None:
        self.balance, self.turns = state["balance"], state["turns"]


class LedgerNoStateEnv(LedgerEnv):
    get_state = TextEnv.get_state  # no snapshot: forks replay the tool calls
    set_state = TextEnv.set_state


register_env("user/Ledger-v0", LedgerEnv, max_episode_steps=6)
register_env("user/LedgerNoState-v0", LedgerNoStateEnv, max_episode_steps=6)


_ROLLS = itertools.count(1)
"""Every roll of this process, numbered: process-wide state, as ``random`` is."""


class DiceEnv(TextEnv):
    """Roll a die until a six; the die is the process-wide ``random`` (a common mistake).

    Each reply also says how many rolls this process has made: a replay then never gives
    the same replies (with the die alone, a one-roll episode replayed the same six times
    in 36 and the test that expects it flagged failed then)."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.rolls = 0
        return "Say roll to roll the die.", {}

    def step(self, action: str):
        import random

        self.rolls += 1
        face = random.randint(1, 6)
        reply = f"You rolled {face} (roll {next(_ROLLS)} of this process)."
        return reply, float(face == 6), face == 6, self.rolls >= 5, {}


register_env("user/Dice-v0", DiceEnv, max_episode_steps=6)

"""Python puzzles: questions too big for mental arithmetic, a sandboxed Python tool.

The agent may run code with the ``python`` tool (an OS-level sandbox: namespaces, a
read-only system, seccomp, time, memory and process limits) and ends with
``Answer: N``; reward 1 if N is right. The env computes the target itself; it never
runs the model's code.
"""

from __future__ import annotations

from typing import Any

from agentrl.env import TextEnv, final_answer_step
from tools.python_sandbox import python


def _fibonacci(n: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def _primes_below(n: int) -> int:
    sieve = bytearray([1]) * n
    sieve[:2] = b"\0\0"
    for i in range(2, int(n**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytearray(len(range(i * i, n, i)))
    return sum(sieve)


# (question template, range of n, answer of n)
PUZZLES = (
    (
        "What is the sum of the squares of the integers from 1 to {n}?",
        (50, 500),
        lambda n: sum(i * i for i in range(1, n + 1)),
    ),
    ("What is the {n}-th Fibonacci number, with F(1) = F(2) = 1?", (20, 90), _fibonacci),
    ("How many prime numbers are smaller than {n}?", (1000, 20000), _primes_below),
    (
        "What is the sum of the decimal digits of 2 to the power {n}?",
        (50, 400),
        lambda n: sum(int(d) for d in str(2**n)),
    ),
)


class PythonPuzzleEnv(TextEnv):
    tools = (python,)
    system_prompt = "Write Python with the python tool to compute it, then reply 'Answer: N'."

    def __init__(self) -> None:
        self.kind, self.n = 0, PUZZLES[0][1][0]

    @property
    def target(self) -> int:
        return PUZZLES[self.kind][2](self.n)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.kind = int(self.np_random.integers(len(PUZZLES)))
        low, high = PUZZLES[self.kind][1]
        self.n = int(self.np_random.integers(low, high + 1))
        return PUZZLES[self.kind][0].format(n=self.n), {"target": self.target}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return final_answer_step(action, self.target)

    def get_state(self) -> dict[str, Any]:
        return {"kind": self.kind, "n": self.n}

    def set_state(self, state: dict[str, Any]) -> None:
        self.kind, self.n = int(state["kind"]), int(state["n"])

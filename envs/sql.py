"""SQL: answer a question about a small company database generated at every reset.

Each episode gets its own SQLite file (rows drawn from the env's seeded generator),
a read-only ``query`` tool bound to that file, and one question. The agent ends with
``Answer: N``; reward 1 if right. The database is rebuilt from the episode's seed,
so ``get_state`` is just that seed and the question.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
import weakref
from pathlib import Path
from typing import Any

from agentrl.env import TextEnv, final_answer_step
from tools.sqlite_query import sql_tool

DEPARTMENTS = ("sales", "research", "support", "legal")
NAMES = ("Ada", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea")
SCHEMA = (
    "CREATE TABLE employees (id INTEGER PRIMARY KEY, name TEXT, department TEXT, salary INTEGER)"
)
QUESTIONS = (
    (
        "What is the total salary of the {d} department?",
        "SELECT SUM(salary) FROM employees WHERE department = ?",
    ),
    (
        "How many employees work in the {d} department?",
        "SELECT COUNT(*) FROM employees WHERE department = ?",
    ),
    (
        "What is the highest salary in the {d} department?",
        "SELECT MAX(salary) FROM employees WHERE department = ?",
    ),
)


class SqlEnv(TextEnv):
    system_prompt = (
        "Answer with the query tool on table employees(id, name, department, salary), "
        "then reply 'Answer: N'."
    )

    def __init__(self, rows: int = 24) -> None:
        self.rows = rows
        self._dir = Path(tempfile.mkdtemp(prefix="agentrl-sql-"))
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._dir, ignore_errors=True)
        self.database = self._dir / "company.db"
        self.tools = (sql_tool(self.database),)  # per instance: bound to this env's file
        self.db_seed, self.kind, self.department, self.target = 0, 0, DEPARTMENTS[0], 0

    def _build(self) -> None:
        """Write the database for ``db_seed`` atomically, then compute the target."""
        import numpy as np

        rng = np.random.default_rng(self.db_seed)
        rows = [
            (
                i + 1,
                str(rng.choice(NAMES)),
                str(rng.choice(DEPARTMENTS)),
                int(rng.integers(30, 200)) * 1000,
            )
            for i in range(self.rows)
        ]
        tmp = self._dir / "company.db.tmp"
        tmp.unlink(missing_ok=True)
        with sqlite3.connect(tmp) as conn:
            conn.execute(SCHEMA)
            conn.executemany("INSERT INTO employees VALUES (?, ?, ?, ?)", rows)
        conn.close()
        tmp.replace(self.database)
        with sqlite3.connect(f"file:{self.database}?mode=ro", uri=True) as conn:
            value = conn.execute(QUESTIONS[self.kind][1], (self.department,)).fetchone()[0]
        conn.close()
        self.target = int(value or 0)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.db_seed = int(self.np_random.integers(2**31 - 1))
        self.kind = int(self.np_random.integers(len(QUESTIONS)))
        self.department = str(self.np_random.choice(DEPARTMENTS))
        self._build()
        return QUESTIONS[self.kind][0].format(d=self.department), {"target": self.target}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return final_answer_step(action, self.target)

    def get_state(self) -> dict[str, Any]:
        return {"db_seed": self.db_seed, "kind": self.kind, "department": self.department}

    def set_state(self, state: dict[str, Any]) -> None:
        self.db_seed, self.kind = int(state["db_seed"]), int(state["kind"])
        self.department = str(state["department"])
        self._build()

    def close(self) -> None:
        self._cleanup()  # idempotent: safe to call twice

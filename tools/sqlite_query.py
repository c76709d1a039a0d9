"""A read-only SQLite query tool over a database file."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

MAX_ROWS = 50


def run_query(database: str | Path, sql: str, *, max_rows: int = MAX_ROWS) -> str:
    """Run ``sql`` on ``database`` opened read-only; rows as text, or an error message."""
    uri = f"file:{Path(database).resolve()}?mode=ro"
    try:
        with sqlite3.connect(uri, uri=True, timeout=5) as conn:
            conn.execute("PRAGMA query_only = ON")
            cursor = conn.execute(sql)
            names = [d[0] for d in cursor.description or ()]
            rows = cursor.fetchmany(max_rows + 1)
    except sqlite3.Error as e:
        return f"Error: {e}"
    lines = [" | ".join(names)] + [" | ".join(str(v) for v in row) for row in rows[:max_rows]]
    if len(rows) > max_rows:
        lines.append(f"... (more than {max_rows} rows; add LIMIT or WHERE)")
    return "\n".join(lines)


def sql_tool(database: str | Path) -> Callable[[str], str]:
    """A `query` tool bound to one database file."""

    def query(sql: str) -> str:
        """Run a read-only SQL query on the database and return the rows.

        Args:
            sql: One SQLite SELECT statement.
        """
        return run_query(database, sql)

    return query

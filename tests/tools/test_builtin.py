"""The shipped calculator, SQLite and search tools."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tools.calculator import calculator
from tools.search import search_tool
from tools.sqlite_query import sql_tool


def test_calculator_is_safe_and_forgiving() -> None:
    assert calculator("47*38") == "1786"
    assert calculator("384-099") == "285"  # leading zeros: arithmetic, not a syntax error
    assert calculator("10.05 + 1") == "11.05"
    assert calculator("(1+2)*3") == "9"
    assert calculator("7/2") == "3.5"
    for bad in ["1/0", "__import__('os').system('true')", "2**1000", "", "x" * 500, "1 +"]:
        assert calculator(bad).startswith("Error:"), bad


def test_sql_tool_is_read_only(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE items (name TEXT, price INTEGER)")
        conn.executemany("INSERT INTO items VALUES (?, ?)", [("pen", 2), ("book", 12)])
    query = sql_tool(db)
    assert query("SELECT name FROM items WHERE price > 5") == "name\nbook"
    assert query("DELETE FROM items").startswith("Error:")
    assert query("DROP TABLE items").startswith("Error:")
    assert query("SELEC nonsense").startswith("Error:")
    assert "pen" in query("SELECT * FROM items")


def test_search_ranks_relevant_documents_first() -> None:
    corpus = {
        "cats": "Cats are small felines that purr.",
        "dogs": "Dogs bark and fetch sticks.",
        "birds": "Birds fly; some birds sing.",
    }
    search = search_tool(corpus)
    assert search("which animals bark").startswith("[dogs]")
    assert search("birds sing").startswith("[birds]")
    assert search("zebra") == "No documents match."

"""Every Python block of the README and the docs pages runs, so an example cannot rot.

A small collector (no plugin): the ```` ```python ```` blocks of a page run in order in one
namespace (a later block may use what an earlier one defined), from the repository root,
with top-level ``await`` allowed. A block that cannot run here (it starts vLLM, or needs a
setup the page only describes) is marked on the line before it with
``<!-- not-run: REASON -->``; it is still compiled, and counted. ``if __name__ ==
"__main__":`` bodies do not run (the namespace is not ``__main__``).
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import inspect
import re
import sys
from pathlib import Path

import pytest

from tests.docs.conftest import ROOT

pytestmark = pytest.mark.timeout(300)

NOT_RUN = re.compile(r"<!--\s*not-run:\s*(.+?)\s*-->")
FENCE = re.compile(r"^(\s*)```(\w*)")


@dataclasses.dataclass(frozen=True)
class Block:
    path: Path
    line: int
    code: str
    not_run: str | None
    """Why it does not run here; None when it runs."""


def blocks(path: Path) -> list[Block]:
    """The Python blocks of a Markdown file, with the reason a block is not run."""
    found: list[Block] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = m.group(1), m.group(2), i
        i += 1
        body = []
        while i < len(lines) and not lines[i].strip().startswith("```"):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1
        if lang in ("python", "py"):
            before = lines[start - 1] if start else ""
            reason = NOT_RUN.search(before)
            found.append(
                Block(path, start + 1, "\n".join(body) + "\n", reason.group(1) if reason else None)
            )
    return found


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
WITH_CODE = [p for p in PAGES if blocks(p)]


@pytest.mark.parametrize("page", WITH_CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(page: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT))
    namespace: dict[str, object] = {"__name__": "__docs__"}
    for block in blocks(page):
        where = f"{page.relative_to(ROOT)}:{block.line}"
        code = compile(block.code, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        if block.not_run is not None:
            continue
        try:
            result = eval(code, namespace)
            if inspect.iscoroutine(result):
                asyncio.run(result)
        except Exception as e:
            raise AssertionError(f"the Python block at {where} failed: {e!r}") from e


def test_most_blocks_run_and_every_skip_says_why() -> None:
    every = [b for p in PAGES for b in blocks(p)]
    skipped = [b for b in every if b.not_run is not None]
    print(
        f"\ndocs Python blocks: {len(every)} in all, {len(every) - len(skipped)} run, "
        f"{len(skipped)} not run:",
        file=sys.stderr,
    )
    for b in skipped:
        print(f"  {b.path.relative_to(ROOT)}:{b.line}: {b.not_run}", file=sys.stderr)
    assert every, "no Python block found: the collector is broken"
    assert all(len(b.not_run or "reason") > 10 for b in skipped), "a not-run block needs a reason"
    assert len(skipped) * 3 <= len(every), "most blocks must run"


def test_the_collector_reads_a_marked_block(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "text\n\n```python\nx = 1\n```\n<!-- not-run: needs a GPU to run -->\n"
        "```python\nawait y()\n```\n  ```python\n  z = 2\n  ```\n"
    )
    found = blocks(page)
    assert [(b.line, b.not_run) for b in found] == [
        (3, None),
        (7, "needs a GPU to run"),
        (10, None),
    ]
    assert found[2].code == "z = 2\n"

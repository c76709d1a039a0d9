"""``agentrl view --bundle OUT/``: the viewer as a static site that opens from disk.

OUT/ gets the page's own files (``index.html``, ``static/``) and the answers of the
JSON endpoints written as ``data/N.js`` scripts (``window.AGENTRL_DATA[key] = {...}``)
with ``data/index.js`` naming the file of each key: a page opened from ``file://``
cannot fetch JSON, but it can load scripts. In a bundle the page filters and pages the
episodes itself, over the full list. Reads the run directories as the server does;
writes only under OUT/.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError
from agentrl.view.data import FILTERS, ViewData
from agentrl.view.server import STATIC

EVERY_EPISODE = {"limit": "1000000000"}


def write_bundle(
    data: ViewData,
    out: Path,
    *,
    max_episodes: int | None = None,
    where: Mapping[str, str] | None = None,
    say: Callable[[str], None] = lambda line: None,
) -> int:
    """Write the static site of every run under ``data``'s root to ``out``; return how
    many episodes it holds: those matching ``where`` (the filters of
    :data:`~agentrl.view.data.FILTERS`), at most ``max_episodes`` per run, newest first."""
    where = dict(where or {})
    _check(data, out, where)
    (out / "data").mkdir(parents=True, exist_ok=True)
    shutil.copytree(STATIC, out / "static", dirs_exist_ok=True)
    page = (STATIC / "index.html").read_text()
    (out / "index.html").write_text(
        page.replace("<!--bundle-->", '<script src="data/index.js"></script>')
    )
    index: dict[str, str] = {}

    def put(key: str, value: Any) -> None:
        name = f"{len(index)}.js"
        index[key] = name
        text = json.dumps(value, separators=(",", ":")).replace("</", "<\\/")
        (out / "data" / name).write_text(f"window.AGENTRL_DATA[{json.dumps(key)}]={text};\n")

    runs = data.runs()
    put("runs", runs)
    episodes = 0
    for run in runs["runs"]:
        if run.get("status") == "unreadable":
            continue
        run_id = run["id"]
        put(f"run?run={run_id}", data.run(run_id))
        query = {**where, **({"limit": str(max_episodes)} if max_episodes else EVERY_EPISODE)}
        page_of = data.episodes(run_id, query, page_max=10**9)
        put(f"episodes?run={run_id}", page_of)
        for row in page_of["rows"]:
            key = f"episode?run={run_id}&id={row['episode_id']}&attempt={row['attempt']}"
            put(key, data.episode(run_id, row["episode_id"], row["attempt"]))
            episodes += 1
        say(f"{run_id}: {len(page_of['rows'])} episodes")
    (out / "data" / "index.js").write_text(
        "window.AGENTRL_DATA={};window.AGENTRL_INDEX="
        + json.dumps(index, separators=(",", ":")).replace("</", "<\\/")
        + ";\n"
    )
    return episodes


def _check(data: ViewData, out: Path, where: Mapping[str, str]) -> None:
    """Refuse a bundle folder that holds something else or lies in a run directory, and
    filters the page does not know."""
    unknown = sorted(set(where) - set(FILTERS))
    if unknown:
        raise ConfigError(f"--where {unknown[0]}=...: not a filter; use one of {list(FILTERS)}")
    if out.exists() and any(out.iterdir()) and not (out / "data" / "index.js").exists():
        raise ConfigError(
            f"{str(out)!r} is not empty and is not a bundle; give a new or empty "
            "folder for --bundle"
        )
    if out.resolve() == data.root or data.root in out.resolve().parents:
        raise ConfigError(
            f"--bundle {str(out)!r} is inside the run directory {str(data.root)!r}, "
            "which the viewer never writes to; choose a folder outside it"
        )

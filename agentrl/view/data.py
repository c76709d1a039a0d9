"""What the viewer's JSON endpoints answer, for a root of run directories.

:class:`ViewData` is shared by the server (:mod:`agentrl.view.server`, one call per
request) and the static bundle (:mod:`agentrl.view.bundle`, every call once). Each
method opens the run's store read-only for the call and closes it, so a running
train's writes are seen at the next request. Bad input (an unknown run, a filter that
is not a number) raises :class:`~agentrl.errors.ConfigError` with one line that says
what was wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError
from agentrl.store import browse
from agentrl.view import runs
from agentrl.view.episodes import episode_detail
from agentrl.view.tokens import TokenText

FILTERS = (
    "state",
    "env",
    "min_reward",
    "max_reward",
    "min_version_span",
    "failure",
    "attempt",
    "origin",
)
"""The episode filters a request (or ``--bundle --where``) may give."""

PAGE_MAX = 500
"""The most episodes one page may hold."""


class ViewData:
    """The viewer's data over ``root`` (a run directory or a folder of them)."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self._runs = runs.find_runs(self.root)
        self._texts: dict[str, TokenText] = {}

    def run_dir(self, run_id: str) -> Path:
        """The directory of run ``run_id`` (only runs found under the root: never a path
        the request makes up)."""
        if run_id not in self._runs:
            self._runs = runs.find_runs(self.root)
        if run_id not in self._runs:
            raise ConfigError(
                f"no run {run_id!r} under {str(self.root)!r}; the runs are {sorted(self._runs)}"
            )
        return self._runs[run_id]

    def runs(self) -> dict[str, Any]:
        self._runs = runs.find_runs(self.root)
        return {
            "root": str(self.root),
            "runs": [runs.summary(i, d) for i, d in sorted(self._runs.items())],
        }

    def run(self, run_id: str) -> dict[str, Any]:
        return runs.detail(run_id, self.run_dir(run_id))

    def live(self, run_id: str) -> dict[str, Any]:
        return runs.live(self.run_dir(run_id))

    def episodes(
        self, run_id: str, query: Mapping[str, str], *, page_max: int = PAGE_MAX
    ) -> dict[str, Any]:
        """One page of episodes: ``query`` holds the filters (state, env, min_reward,
        max_reward, min_version_span, failure, attempt, origin), ``limit`` (at most
        ``page_max``), ``offset`` and ``sort``."""
        where = browse.EpisodeFilter(
            state=query.get("state") or None,
            env_id=query.get("env") or None,
            min_reward=_number(query, "min_reward", float),
            max_reward=_number(query, "max_reward", float),
            min_version_span=_number(query, "min_version_span", int),
            failure=query.get("failure") or None,
            attempt=_number(query, "attempt", int),
            origin=query.get("origin") or None,
        )
        limit = min(_number(query, "limit", int) or 50, page_max)
        offset = max(_number(query, "offset", int) or 0, 0)
        sort = query.get("sort") or "newest"
        if sort not in browse.SORTS:
            raise ConfigError(f"sort={sort!r}: use one of {sorted(browse.SORTS)}")
        with runs.open_store(self.run_dir(run_id)) as store:
            rows, total = browse.episode_page(store, where, limit=limit, offset=offset, sort=sort)
            facets = browse.facets(store)
        return {"rows": rows, "total": total, "limit": limit, "offset": offset, **facets}

    def episode(self, run_id: str, episode_id: str, attempt: int | None) -> dict[str, Any]:
        run_dir = self.run_dir(run_id)
        with runs.open_store(run_dir) as store:
            texts = self._texts.get(run_id)
            if texts is None:
                config = store.first_config() or {}
                model = (config.get("model") or {}).get("path")
                texts = self._texts[run_id] = TokenText(run_dir, model)
            return {**episode_detail(store, episode_id, attempt, texts), "run_dir": str(run_dir)}


def _number(query: Mapping[str, str], key: str, kind: type) -> Any:
    raw = query.get(key)
    if raw is None or raw == "":
        return None
    try:
        return kind(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not a number") from None

"""What a user sees of a run: status.json, metrics files, the live display, `agentrl top`.

* :class:`MetricsLog` appends one JSON object per optimizer step to ``metrics.jsonl``
  and writes the same scalars as TensorBoard event files (``tb/``), and to wandb or
  trackio when asked for and installed; :func:`read_metrics` reads the rows back.
* :func:`write_status` rewrites ``status.json`` atomically: the run's headline numbers
  and every in-flight episode. ``agentrl top RUN_DIR`` reads it from another terminal.
* :func:`render` turns a status into a rich renderable; the live display during
  ``agentrl train`` and ``agentrl top`` both use it; :func:`plain_line` is the
  one-line form.

The live state those files are written from (:class:`agentrl.status.RunStatus`) and
the run's own lines for the user (:class:`agentrl.status.Reporter`) are
:mod:`agentrl.status`'s.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError
from agentrl.jsondata import jsonable

logger = logging.getLogger(__name__)

STATUS_FILE = "status.json"
ENDED = ("finished", "failed", "interrupted", "stopped")
"""The states of a run that ended (``stopped``: by ``health.stop_on``)."""
METRICS_FILE = "metrics.jsonl"


class MetricsLog:
    """Per-step scalars to JSONL, TensorBoard and (optionally) wandb / trackio."""

    def __init__(
        self,
        run_dir: Path,
        *,
        tensorboard: bool = True,
        wandb: bool = False,
        trackio: bool = False,
        name: str = "run",
        config: dict[str, Any] | None = None,
    ) -> None:
        self.path = run_dir / METRICS_FILE
        self._file = self.path.open("a", encoding="utf-8")
        self._tb: Any = None
        self._wandb: Any = None
        self._trackio: Any = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(run_dir / "tb"))
        if wandb:
            try:
                import wandb as wandb_module
            except ImportError:
                raise ConfigError(
                    "log.wandb = true but wandb is not installed; `pip install wandb` or set it "
                    "to false"
                ) from None
            self._wandb = wandb_module.init(
                project="agentrl", name=name, config=config, dir=str(run_dir)
            )
        if trackio:
            try:
                import trackio as trackio_module
            except ImportError:
                raise ConfigError(
                    "log.trackio = true but trackio is not installed; `pip install trackio` or "
                    "set it to false"
                ) from None
            self._trackio = trackio_module
            trackio_module.init(project="agentrl", name=name, config=config)

    def log(self, step: int, values: Mapping[str, Any], *, kind: str = "train") -> None:
        """One row of ``kind`` ("train": a step's row; "eval": an evaluation's, at the
        step it started after) to every sink; the numbers also as ``KIND/NAME`` scalars."""
        row = {"kind": kind, "time": time.time(), **values, "step": step}
        self._file.write(json.dumps(jsonable(row)) + "\n")
        self._file.flush()
        scalars = {
            f"{kind}/{k}": float(v)
            for k, v in values.items()
            if isinstance(v, int | float)
            and not isinstance(v, bool)
            and math.isfinite(v)
            and k != "step"
        }
        if self._tb is not None:
            for name, value in scalars.items():
                self._tb.add_scalar(name, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)
        if self._trackio is not None:
            self._trackio.log(scalars, step=step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._trackio is not None:
            self._trackio.finish()


def read_metrics(run_dir: Path, kind: str | None = "train") -> list[dict[str, Any]]:
    """The rows of ``metrics.jsonl`` (of one kind), skipping a torn last line."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if kind is None or row.get("kind") == kind:
            rows.append(row)
    return rows


def write_status(run_dir: Path, status: dict[str, Any]) -> None:
    """Replace ``status.json`` atomically (readers never see half a file)."""
    tmp = run_dir / f".{STATUS_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(jsonable(status)))
    os.replace(tmp, run_dir / STATUS_FILE)


def read_status(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(run_dir) / STATUS_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---- rendering -----------------------------------------------------------------------


def _fmt(value: Any, spec: str = ".3f", missing: str = "-") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return missing
    return format(value, spec)


def headline(status: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The run's numbers as (label, value) pairs, in display order."""
    t = status.get("time", {})
    wall = max(t.get("wall_s", 0.0), 1e-9)
    errors = status.get("errors", {})
    tool_use = _tool_use(status.get("tools", True), status.get("tool_use_rate"), ".1%")
    return [
        ("state", str(status.get("state", "?"))),
        (
            "step",
            f"{status.get('step', 0)}/{status.get('steps', '?')}  "
            f"(version {status.get('version', 0)})",
        ),
        (
            "reward",
            f"{_fmt(status.get('reward_mean'))}  success "
            f"{_fmt(status.get('success_rate'), '.1%')}{tool_use}",
        ),
        ("tokens/s", _fmt(status.get("tokens_per_s"), ",.0f")),
        *(
            [
                (
                    "staleness",
                    f"mean {_fmt(status.get('staleness_mean'), '.2f')}  "
                    f"max {_fmt(status.get('staleness_max'), '.0f')}",
                )
            ]
            if _async(status)
            else []
        ),
        (
            "queue",
            f"{status.get('queue_depth', 0)} groups  |  in flight "
            f"{status.get('in_flight', 0)} episodes",
        ),
        ("errors", ", ".join(f"{k} {v}" for k, v in sorted(errors.items())) or "none"),
        (
            "time",
            f"generating {t.get('generation_s', 0.0) / wall:.0%}  training "
            f"{t.get('training_s', 0.0) / wall:.0%}  weight sync "
            f"{t.get('publish_s', 0.0) / wall:.0%}  of {wall:.0f} s",
        ),
        *_servers(status.get("servers") or []),
        *_placement(status.get("placement") or []),
        *_health(status.get("health") or []),
    ]


def _tool_use(tools: bool, rate: Any, spec: str) -> str:
    """``"  tool use N%"``, or nothing for an env without tools (status ``tools``)."""
    return f"  tool use {_fmt(rate, spec)}" if tools else ""


def _async(status: Mapping[str, Any]) -> bool:
    """Whether staleness applies: not in ``train.mode = "sync"``, where it is always 0."""
    return status.get("mode") != "sync"


def _health(warnings: list[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """The health warnings of the run (the last few), newest last; none: no line."""
    if not warnings:
        return []
    text = "  |  ".join(
        f"{w.get('rule')} at step {w.get('step')}: {w.get('message')}" for w in warnings[-3:]
    )
    return [("health", f"[yellow]{_escape(text)}[/]")]


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _servers(servers: list[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """One line for the inference servers: how many are up, and why any is not."""
    if not servers:
        return []
    up = [s for s in servers if s.get("up")]
    parts = [f"{len(up)}/{len(servers)} up"]
    parts += [f"{s['url']}: {s.get('in_flight', 0)} in flight, v{s.get('version', 0)}" for s in up]
    parts += [
        f"{s['url']} DOWN ({str(s.get('reason', ''))[:80]})" for s in servers if not s.get("up")
    ]
    return [("servers", "  |  ".join(parts))]


def _placement(rows: list[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """The pieces on a Ray cluster, one line per node: ``node IP (ID): inference 0,1; env 1;
    worker 0; trainer 0``, each piece not alive (or restarted) on its own with its state,
    restarts and why; pieces not placed yet on a line of their own."""
    if not rows:
        return []
    nodes: dict[tuple[bool, str, str], list[tuple[str, str, bool]]] = {}
    for r in rows:
        node = str(r.get("node_id") or "")
        key = (not node, str(r.get("node_ip") or "?"), node)
        nodes.setdefault(key, []).append(_piece(r))
    lines = []
    for (unplaced, ip, node), pieces in sorted(nodes.items()):
        where = "not placed yet" if unplaced else f"node {_escape(ip)} ({_escape(node[:6])})"
        lines.append(f"{where}: {'; '.join(_merged(pieces))}")
    return [("cluster", "\n".join(lines))]


def _piece(row: Mapping[str, Any]) -> tuple[str, str, bool]:
    """(piece, its text, whether it is plainly alive): the index, and for a piece restarted
    or not alive its state, restarts and why (escaped; coloured unless alive)."""
    piece, state = str(row.get("piece") or "?"), str(row.get("state") or "?")
    restarts = int(row.get("restarts") or 0)
    text = str(row.get("index", "?"))
    if state == "alive" and not restarts:
        return _escape(piece), _escape(text), True
    text = f"{piece} {text}" if state == "alive" else f"{piece} {text} {state}"
    if restarts:
        text += f" ({restarts} restart{'s' if restarts > 1 else ''})"
    if state != "alive" and row.get("reason"):
        text += f": {str(row['reason'])[:80]}"
    colour = {"alive": "", "dead": "red"}.get(state, "yellow")
    return _escape(piece), f"[{colour}]{_escape(text)}[/]" if colour else _escape(text), False


def _merged(pieces: list[tuple[str, str, bool]]) -> list[str]:
    """Alive pieces of one kind as one item (``inference 0,1``), each other piece alone."""
    items: list[str] = []
    last: str | None = None
    for piece, text, plain in pieces:
        if plain and last == piece:
            items[-1] += f",{text}"
        else:
            items.append(f"{piece} {text}" if plain else text)
        last = piece if plain else None
    return items


def _pieces_alive(rows: list[Mapping[str, Any]]) -> str:
    """``  pieces 7/8 alive`` when a piece on the cluster is not, else nothing."""
    alive = sum(r.get("state") == "alive" for r in rows)
    return f"  pieces {alive}/{len(rows)} alive" if rows and alive < len(rows) else ""


def render(status: Mapping[str, Any], *, episodes: bool = True, limit: int = 30) -> Any:
    """A rich renderable: the headline, then (optionally) the in-flight episodes."""
    from rich.console import Group as RichGroup
    from rich.table import Table

    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold cyan", justify="right")
    head.add_column()
    title = status.get("name", "run")
    for label, value in headline(status):
        head.add_row(label, value)
    for label, ev in (status.get("eval") or {}).items():
        head.add_row(f"eval {label}", eval_cell(ev, tools=status.get("tools", True)))
    running = status.get("eval_running")
    if running:
        head.add_row(
            f"eval {running.get('label', '')}",
            f"running beside training ({running.get('in_flight', 0)} in flight)",
        )
    parts: list[Any] = [f"[bold]{title}[/]  {status.get('run_dir', '')}", head]
    if episodes:
        parts.append(_episodes_table(status, limit))
    return RichGroup(*parts)


def _episodes_table(status: Mapping[str, Any], limit: int) -> Any:
    """The in-flight episodes, oldest version first (a tools column only with tools)."""
    from rich.table import Table

    tools = status.get("tools", True)
    live = list(status.get("episodes", []))
    table = Table(
        title=f"in-flight episodes ({len(live)})",
        title_justify="left",
        show_edge=False,
        pad_edge=False,
    )
    for col in (
        "episode",
        "env",
        "turn",
        "age (versions)",
        "tokens by version",
        *(["tools"] if tools else []),
        "waiting on",
        "age",
    ):
        table.add_column(col, justify="right" if col in ("turn", "tools", "age") else "left")
    version = int(status.get("version", 0))
    for ep in sorted(live, key=lambda e: e.get("started_version", 0))[:limit]:
        by_version = ep.get("tokens_by_version", {})
        table.add_row(
            str(ep.get("episode", "")),
            str(ep.get("env", "")),
            str(ep.get("turn", 0)),
            str(version - int(ep.get("started_version", 0))),
            " ".join(f"v{k}:{v}" for k, v in sorted(by_version.items(), key=lambda kv: int(kv[0])))
            or "-",
            *([str(ep.get("tool_calls", 0))] if tools else []),
            str(ep.get("phase", "")),
            f"{ep.get('age_s', 0.0):.1f}s",
        )
    if len(live) > limit:
        table.caption = f"... and {len(live) - limit} more"
    return table


def eval_cell(ev: Mapping[str, Any], *, tools: bool = True) -> str:
    """An evaluation's row (``status.json``'s ``eval``) in a few words (``tools``:
    whether the env has tools; tool use is shown only then)."""
    k = int(ev.get("k", 1))
    pass_k = f"  pass@{k} {_fmt(ev.get(f'pass@{k}'), '.1%')}" if k > 1 else ""
    return (
        f"success {_fmt(ev.get('success_rate'), '.1%')}{pass_k}"
        + _tool_use(tools, ev.get("tool_use_rate"), ".1%")
        + f"  ({ev.get('episodes', 0)} episodes, step {ev.get('step', '?')}, "
        f"version {ev.get('version', '?')})"
    )


def plain_line(status: Mapping[str, Any]) -> str:
    """One line per step for logs and non-terminals."""
    t = status.get("time", {})
    return (
        f"step {status.get('step', 0)}/{status.get('steps', '?')}  "
        f"reward {_fmt(status.get('reward_mean'))}  success "
        f"{_fmt(status.get('success_rate'), '.0%')}"
        + _tool_use(status.get("tools", True), status.get("tool_use_rate"), ".0%")
        + f"  {_fmt(status.get('tokens_per_s'), ',.0f')} tok/s"
        + (f"  staleness {_fmt(status.get('staleness_mean'), '.2f')}" if _async(status) else "")
        + f"  queue {status.get('queue_depth', 0)}  "
        f"in flight {status.get('in_flight', 0)}  errors "
        f"{sum(status.get('errors', {}).values())}  gen/train "
        f"{t.get('generation_s', 0.0):.0f}s/{t.get('training_s', 0.0):.0f}s"
        + _servers_up(status.get("servers") or [])
        + _pieces_alive(status.get("placement") or [])
        + ("  eval running" if status.get("eval_running") else "")
        + (f"  health: {status['health'][-1]['rule']}" if status.get("health") else "")
    )


def _servers_up(servers: list[Mapping[str, Any]]) -> str:
    up = sum(bool(s.get("up")) for s in servers)
    return f"  servers {up}/{len(servers)} up" if servers and up < len(servers) else ""


def live_display(progress: str) -> Any:
    """The rich live display ``log.progress`` asks for (None: none).

    "auto" means rich on a terminal, plain lines otherwise.
    """
    if progress == "auto":
        progress = "rich" if sys.stdout.isatty() else "plain"
    if progress != "rich":
        return None
    from rich.live import Live

    return Live(refresh_per_second=4, transient=False)


def top(run_dir: Path, *, once: bool = False, interval_s: float = 0.5) -> int:
    """``agentrl top RUN_DIR``: a live view of a run, from any terminal."""
    from rich.console import Console
    from rich.live import Live

    run_dir = Path(run_dir)
    console = Console()
    status = read_status(run_dir)
    if status is None:
        if not (run_dir / "episodes.db").exists():
            raise ConfigError(f"{run_dir} is not a run directory (no status.json, no episodes.db)")
        raise ConfigError(f"{run_dir} has no status.json: it was not written by `agentrl train`")

    def view(current: dict[str, Any]) -> Any:
        from rich.console import Group as RichGroup

        parts = [render(current)]
        alive = pid_alive(current.get("pid"))
        if current.get("state") not in ENDED and not alive:
            age = time.time() - float(current.get("updated_at", 0))
            parts.append(
                f"[yellow]the run's process is gone (last update {age:.0f} s ago); "
                f"`agentrl train --resume {run_dir}` continues it[/]"
            )
        elif current.get("state") in ENDED:
            parts.append(_store_summary(run_dir))
        return RichGroup(*parts)

    if once or not console.is_terminal:
        console.print(view(status))
        return 0
    with Live(view(status), console=console, refresh_per_second=4) as live:
        try:
            while True:
                time.sleep(interval_s)
                status = read_status(run_dir) or status
                live.update(view(status))
                if status.get("state") in ENDED or not pid_alive(status.get("pid")):
                    break
        except KeyboardInterrupt:
            pass
    return 0


def _store_summary(run_dir: Path) -> str:
    from agentrl.store import EpisodeStore

    try:
        with EpisodeStore.open(run_dir, create=False) as store:
            stats = store.stats()
    except Exception as e:  # a summary is a courtesy; never fail the view for it
        return f"(episode store unreadable: {e})"
    episodes = ", ".join(f"{k} {v}" for k, v in sorted(stats.get("episodes", {}).items()))
    tasks = ", ".join(f"{k} {v}" for k, v in sorted(stats.get("tasks", {}).items()))
    return f"store: episodes {episodes or 'none'}; tasks {tasks or 'none'}"

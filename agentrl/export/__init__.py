"""Runs that other tools can read: episodes exported to Inspect logs, ATIF trajectories
or agentrl's own JSONL, and read back as data.

``agentrl export RUN --format inspect|atif|jsonl --out PATH`` (:func:`export_run`)
selects episodes with the filters of ``agentrl replay`` (:func:`agentrl.replay.select`)
and streams them, one at a time, into

* :mod:`.inspect_format`: a folder of Inspect AI ``.eval`` logs (``inspect view`` opens
  it);
* :mod:`.atif_format`: one ATIF v1.8 trajectory per line, token ids, logprobs and
  per-token policy versions included;
* ``jsonl``: the loss-free native form of :func:`agentrl.replay.export`.

:mod:`.readback` reads a native or ATIF export back as trajectories with the tokens as
recorded: SFT examples for :mod:`agentrl.sft`, or groups for a training step.
:mod:`.episode` is the view of an episode both exporters share.
"""

from __future__ import annotations

import dataclasses
import glob
import time
from pathlib import Path
from typing import Any, Literal, get_args

from agentrl import replay
from agentrl.errors import ConfigError
from agentrl.export.inspect_format import SAMPLES_PER_LOG
from agentrl.export.readback import offline_groups, read_trajectories, sft_examples
from agentrl.export.runinfo import RunInfo
from agentrl.store import EpisodeStore

ExportFormat = Literal["inspect", "atif", "jsonl"]
FORMATS: tuple[str, ...] = get_args(ExportFormat)

__all__ = [
    "FORMATS",
    "ExportFormat",
    "ExportResult",
    "RunInfo",
    "export_run",
    "offline_groups",
    "output_path",
    "read_trajectories",
    "sft_examples",
]


@dataclasses.dataclass(frozen=True, slots=True)
class ExportResult:
    """What an export wrote."""

    path: Path
    episodes: int
    seconds: float


def output_path(fmt: ExportFormat, out: str | Path, run: RunInfo) -> Path:
    """Where a format writes for ``--out``: the file itself, or for ``inspect`` the
    folder of logs (``<run>-0001.eval``, ...)."""
    path = Path(out)
    if fmt == "inspect":
        if path.suffix == ".eval":
            raise ConfigError(
                f"--out {str(path)!r}: --format inspect writes a folder of .eval logs (one "
                f"per {SAMPLES_PER_LOG} episodes); give a folder, e.g. "
                f"{str(path.with_suffix(''))!r}"
            )
        earlier = sorted(path.glob(f"{glob.escape(run.name)}-[0-9][0-9][0-9][0-9].eval"))
        if earlier:
            raise ConfigError(
                f"--out {str(path)!r} already holds {earlier[0].name} (an earlier export of "
                f"{run.name!r}); choose another folder or remove its {run.name}-*.eval logs"
            )
    elif path.exists() and path.is_dir():
        raise ConfigError(
            f"--out {str(path)!r} is a folder; give a file path, e.g. "
            f"{str(path / ('episodes.' + fmt + '.jsonl'))!r}"
        )
    return path


async def export_run(
    store: EpisodeStore, fmt: ExportFormat, out: str | Path, **filters: Any
) -> ExportResult:
    """Export the store's episodes matching ``filters`` (those of ``agentrl replay``)."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    run = RunInfo.of(store)
    path = output_path(fmt, out, run)
    started = time.perf_counter()
    episodes = replay.select(store, **filters)
    if fmt == "jsonl":
        count = replay.export(store, path, only=episodes)
    elif fmt == "atif":
        from agentrl.export.atif_format import write_atif

        count = write_atif(episodes, run, path)
    else:
        from agentrl.export.inspect_format import write_inspect

        _writable_folder(path)
        count = await write_inspect(episodes, run, path)
    return ExportResult(path, count, time.perf_counter() - started)


def _writable_folder(path: Path) -> None:
    """Create the folder ``path``, or refuse in one line."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"cannot create {str(path)!r}: {e.strerror or e}; choose another --out"
        ) from e

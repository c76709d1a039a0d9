"""Forks started from the viewer's page (``agentrl view --allow-fork``).

A fork runs ``agentrl replay RUN_DIR EPISODE --fork-at TURN`` in a subprocess: the
same machinery, policy choice and output as the CLI, an inference engine of its own,
and the fork stored where the CLI stores it: as a new episode ``EPISODE~fork@TURN-N``
(origin ``replay``) in the run's own episode store. That episode is the only thing a
fork writes; the viewer itself still opens every store read-only.

At most one fork runs at a time (each starts an engine); its task belongs to the
server's task group, so stopping the viewer stops the fork's process. In:
:class:`~agentrl.view.data.ViewData` (which runs exist) and the request's JSON body.
Out: :class:`ForkJob` as JSON, its progress being the lines the command printed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from agentrl.errors import ConfigError
from agentrl.store import browse
from agentrl.view import runs
from agentrl.view.data import ViewData

FORK_HEADER = "X-Agentrl-Fork"
"""A header every fork request must carry: a cross-site form or a plain link cannot send
one, and a cross-site script needs a CORS preflight the viewer never grants."""

FORK_TIMEOUT_S = 1800.0
"""The longest a fork may run (engine start included) before it is stopped."""

_STORED = re.compile(r"^stored as (\S+)$")


class ForkBusy(ConfigError):
    """A fork is running already."""


@dataclasses.dataclass(slots=True)
class ForkJob:
    """One fork started from the page."""

    job: int
    run: str
    episode: str
    attempt: int | None
    turn: int
    state: Literal["running", "done", "failed"] = "running"
    lines: list[str] = dataclasses.field(default_factory=list)
    """What the command printed so far (its progress)."""
    fork_id: str | None = None
    """The fork's episode id, once stored."""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def fork_command(run_dir: Path, episode: str, attempt: int | None, turn: int) -> list[str]:
    """The ``agentrl replay`` command a fork runs (the page shows it too)."""
    tail = [] if attempt is None else ["--attempt", str(attempt)]
    return [
        sys.executable,
        "-m",
        "agentrl.cli",
        "replay",
        str(run_dir),
        episode,
        "--fork-at",
        str(turn),
        *tail,
    ]


class Forks:
    """The forks of one viewer: started in ``group``, one at a time."""

    def __init__(self, data: ViewData, group: asyncio.TaskGroup) -> None:
        self.data = data
        self.group = group
        self.jobs: dict[int, ForkJob] = {}

    def running(self) -> ForkJob | None:
        return next((j for j in self.jobs.values() if j.state == "running"), None)

    async def start(self, body: Mapping[str, Any]) -> ForkJob:
        """Check the request (``run``, ``id``, ``turn``, optional ``attempt``) and start it.

        Raises:
            ConfigError: the run, episode or turn is missing or malformed.
            ForkBusy: another fork is running.
        """
        self._not_busy()
        job, command = await asyncio.to_thread(self._checked, body)  # reads the store
        self._not_busy()
        job.job = len(self.jobs) + 1
        self.jobs[job.job] = job
        self.group.create_task(self._run(job, command), name=f"fork-{job.job}")
        return job

    def _not_busy(self) -> None:
        busy = self.running()
        if busy is not None:
            raise ForkBusy(
                f"a fork is running already ({busy.episode} at turn {busy.turn}); "
                "wait for it to end"
            )

    def _checked(self, body: Mapping[str, Any]) -> tuple[ForkJob, list[str]]:
        run, episode = str(body.get("run") or ""), str(body.get("id") or "")
        turn, attempt = _whole(body, "turn"), _whole(body, "attempt", optional=True)
        if not run or not episode or turn is None:
            raise ConfigError("a fork request needs JSON {run, id, turn} (and attempt)")
        run_dir = self.data.run_dir(run)
        with runs.open_store(run_dir) as store:
            if not browse.attempts(store, episode):
                raise ConfigError(f"no episode {episode!r} in run {run!r}")
        job = ForkJob(0, run, episode, attempt, turn)
        return job, fork_command(run_dir, episode, attempt, turn)

    def status(self, job: str) -> dict[str, Any]:
        if not job.isdigit() or int(job) not in self.jobs:
            raise ConfigError(f"no fork job {job!r}; the jobs are {sorted(self.jobs)}")
        return self.jobs[int(job)].as_dict()

    async def _run(self, job: ForkJob, command: list[str]) -> None:
        """Run the fork; whatever goes wrong is the job's (its lines say why), never the
        viewer's: an exception here would end the server's task group."""
        job.lines.append("$ agentrl " + " ".join(command[3:]))
        try:
            await self._follow(job, command)
        except Exception as e:
            job.lines.append(f"the fork could not run: {type(e).__name__}: {e}")
            job.state = "failed"

    async def _follow(self, job: ForkJob, command: list[str]) -> None:
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            async with asyncio.timeout(FORK_TIMEOUT_S):
                assert proc.stdout is not None
                async for raw in proc.stdout:
                    line = raw.decode(errors="replace").rstrip()
                    job.lines.append(line)
                    found = _STORED.match(line)
                    if found:
                        job.fork_id = found.group(1)
                code = await proc.wait()
        except TimeoutError:
            job.lines.append(
                f"stopped: the fork ran over {FORK_TIMEOUT_S:.0f} s; run the "
                "command above from a terminal instead"
            )
            code = -1
        finally:
            if proc.returncode is None:  # cancelled (the viewer stops) or timed out
                os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        job.state = "done" if code == 0 and job.fork_id else "failed"


def _whole(body: Mapping[str, Any], key: str, *, optional: bool = False) -> int | None:
    raw = body.get(key)
    if raw is None or raw == "":
        if optional:
            return None
        raise ConfigError(f"a fork request needs {key} (a whole number)")
    if isinstance(raw, bool) or not str(raw).isdigit():
        raise ConfigError(f"{key}={raw!r} is not a whole number")
    return int(raw)

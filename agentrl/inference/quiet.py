"""Where the engine's processes print: the run's log file, or the terminal.

vLLM's in-process engine runs its engine core (and, on some platforms, a worker) in
processes of its own. As they start they print lines a user can do nothing about, none
of them through a logger this process configures: vLLM's warnings from before vLLM
configures logging in the child ("Triton is installed, but doesn't include CPU
backend"), Python warnings raised inside vLLM (``FutureWarning: torch.distributed.reduce_op
is deprecated``) and C++ warnings written straight to file descriptor 2 ("NUMA binding:
Using MEMBIND policy ..."). A child process inherits its stderr from this one when it is
started, so :func:`stderr_to` points this process's descriptor 2 at the log file while
the engine starts: every process started meanwhile writes there for its whole life.

Whether to do that follows the logging configuration of vLLM in this process:
:func:`is_quiet` is true when the ``vllm`` logger does not pass warnings, as
``agentrl`` without ``-v`` sets it (``agentrl.cli.quiet_vllm``). A program that leaves
vLLM's logging alone sees everything on its terminal, as it would without agentrl.

Not here: the ``vllm serve`` servers, whose whole output goes to their own log files
(:class:`~agentrl.inference.server.VLLMServer`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

ENGINE_LOG = "vllm-engine.log"
"""The engine's log file in the log folder its caller names (the run's ``logs/``)."""


def is_quiet() -> bool:
    """Whether vLLM's warnings are off in this process (``agentrl`` without ``-v``)."""
    return not logging.getLogger("vllm").isEnabledFor(logging.WARNING)


@contextlib.contextmanager
def stderr_to(path: Path) -> Iterator[None]:
    """Point this process's file descriptor 2 at ``path`` (appended to) until the block
    ends; processes started inside the block keep it as their stderr after that.

    Whatever this process itself writes to stderr meanwhile goes there too: keep the
    block to the engine's start, where agentrl writes nothing of its own.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        os.dup2(log, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(log)


@contextlib.contextmanager
def engine_stderr(log_dir: Path | None) -> Iterator[Path | None]:
    """Where the engine's processes print while it starts: ``log_dir``'s
    :data:`ENGINE_LOG` when vLLM is quiet and a folder is given (yields the file), else
    this process's stderr (yields None)."""
    if log_dir is None or not is_quiet():
        yield None
        return
    path = Path(log_dir) / ENGINE_LOG
    with stderr_to(path):
        yield path

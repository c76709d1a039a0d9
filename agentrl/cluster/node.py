"""What runs on a cluster node: one server subprocess inside one Ray actor.

:class:`ServiceProcess` is the body of the actor (:mod:`agentrl.cluster.services` wraps
it with ``ray.remote``): its constructor picks a free port on its node, starts the
server bound to the node's IP (``vllm serve`` built by
:func:`agentrl.inference.server.server_command`, or ``agentrl serve-env ENV_ID``), and
returns once ``/health`` answers. If the server exits, the actor exits with it, so Ray
starts the actor again (``cluster.max_restarts``); if the actor dies (killed, its node
gone), the server dies with it (the kernel's parent-death signal), and so do the
processes the server started (agentrl's watchdog, :func:`agentrl.runtime.stopping.ensure_reaper`).

This module needs no Ray itself: the actor learns its node from the ``node`` argument's
callable, so it can be tested as a plain object.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from agentrl.errors import EngineStartupError
from agentrl.inference.base import InferenceConfig
from agentrl.runtime.stopping import ensure_reaper

logger = logging.getLogger(__name__)

Piece = Literal["inference", "env"]
_PR_SET_PDEATHSIG = 1


@dataclasses.dataclass(frozen=True)
class ServiceSpec:
    """What one service actor runs: a ``vllm serve`` or an ``agentrl serve-env``."""

    piece: Piece
    index: int
    startup_timeout_s: float
    log_dir: str
    cwd: str = ""
    """The directory to run in when it exists on the node (relative env imports)."""
    model: str = ""
    inference: InferenceConfig | None = None
    seed: int | None = None
    max_lora_rank: int | None = None
    env_id: str = ""
    env_imports: tuple[str, ...] = ()
    env_kwargs: str = "{}"
    """JSON of the env's keyword arguments (``agentrl serve-env --kwargs``)."""

    def command(self, host: str, port: int) -> tuple[list[str], dict[str, str]]:
        """The server's command line and environment for ``host:port``."""
        if self.piece == "inference":
            from agentrl.inference.server import server_command

            return server_command(
                self.model,
                self.inference or InferenceConfig(),
                port,
                host,
                seed=self.seed,
                max_lora_rank=self.max_lora_rank,
            )
        command = [
            sys.executable,
            "-m",
            "agentrl.cli",
            "serve-env",
            self.env_id,
            "--host",
            host,
            "--port",
            str(port),
            "--kwargs",
            self.env_kwargs,
        ]
        for module in self.env_imports:
            command += ["--import", module]
        return command, dict(os.environ)


def free_port_on(host: str) -> int:
    """A TCP port free right now on ``host`` (an address of this node)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before exec: own session; SIGKILL when the actor process dies."""
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class ServiceProcess:
    """One server subprocess on this node (the body of a service actor; module docstring).

    Args:
        spec: what to run.
        node: returns this node's (id, IP); the actor passes Ray's runtime context.
    """

    def __init__(self, spec: ServiceSpec, node: Callable[[], tuple[str, str]]) -> None:
        self.spec = spec
        self._stopping = False
        self.node_id, self.host = node()
        self.port = free_port_on(self.host)
        self.url = f"http://{self.host}:{self.port}"
        command, env = spec.command(self.host, self.port)
        log_dir = Path(spec.log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{spec.piece}-server-{spec.index}-{self.port}.log"
        cwd = spec.cwd if spec.cwd and Path(spec.cwd).is_dir() else None
        ensure_reaper()  # the server's own children (vLLM's engine) die with this actor too
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                preexec_fn=_die_with_parent,
            )
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        threading.Thread(target=self._exit_with_server, name="server-watch", daemon=True).start()

    def where(self) -> dict[str, Any]:
        """This piece's node, server URL and server PID."""
        return {
            "node_id": self.node_id,
            "node_ip": self.host,
            "url": self.url,
            "pid": self.process.pid,
        }

    def stop(self) -> None:
        """Stop the server and what it spawned (its process group). Safe to call twice."""
        self._stopping = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(10.0)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def _exit_with_server(self) -> None:
        code = self.process.wait()
        if self._stopping:
            return
        logger.error(
            "%s server %d exited with code %s; the actor exits for Ray to restart it",
            self.spec.piece,
            self.spec.index,
            code,
        )
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        os._exit(1)

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.spec.startup_timeout_s
        while True:
            if self.process.poll() is not None:
                raise EngineStartupError(
                    f"the {self.spec.piece} server exited with code {self.process.returncode} "
                    f"before it became healthy; its log ({self.log_path}) ends with:\n"
                    f"{self._log_tail()}"
                )
            if time.monotonic() > deadline:
                raise EngineStartupError(
                    f"the {self.spec.piece} server at {self.url} was not healthy after "
                    f"{self.spec.startup_timeout_s} s; read {self.log_path}"
                )
            with contextlib.suppress(urllib.error.URLError, OSError, json.JSONDecodeError):
                with urllib.request.urlopen(f"{self.url}/health", timeout=2.0) as r:
                    if r.status == 200:
                        return
            time.sleep(0.5)  # a subprocess's port opening can only be polled

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


__all__ = ["ServiceProcess", "ServiceSpec", "free_port_on"]

"""The ``vllm serve`` subprocess: :class:`VLLMServer` starts and stops it.

:class:`VLLMServer` starts the OpenAI-compatible server as a subprocess on 127.0.0.1
and a free port, waits for ``/health`` with a deadline, and stops exactly the
processes it started (the server and the engine processes it spawned, by PID);
:func:`server_command` is its command line and environment. The client that talks
to it is :class:`~agentrl.inference.server.VLLMServerClient`; that module re-exports
these names.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from agentrl.errors import EngineError, EngineStartupError
from agentrl.inference.base import InferenceConfig
from agentrl.models import resolve_model
from agentrl.runtime import cores
from agentrl.runtime.net import free_port
from agentrl.runtime.stopping import descendants, ensure_reaper

logger = logging.getLogger(__name__)


class VLLMServer:
    """A ``vllm serve`` subprocess on 127.0.0.1, started and stopped by this object.

    Use ``async with await VLLMServer.start(config) as server:`` or call :meth:`stop`.
    """

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        port: int,
        log_path: Path,
        command: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.process = process
        self.port = port
        self.log_path = log_path
        self.url = f"http://127.0.0.1:{port}"
        self.command = list(command)
        self.env = env
        self.restarts = 0

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    async def start(
        cls,
        model: str,
        config: InferenceConfig | None = None,
        *,
        seed: int | None = None,
        max_lora_rank: int | None = None,
        port: int | None = None,
        log_dir: str | Path | None = None,
    ) -> VLLMServer:
        """Start the server and wait until ``/health`` answers.

        Raises:
            ModelNotFoundError: the model spec is not a model.
            EngineStartupError: the process exited, or was not healthy within
                ``config.startup_timeout_s`` (the message names that setting and the log).
        """
        config = config or InferenceConfig()
        port = port or free_port()
        command, env = server_command(model, config, port, seed=seed, max_lora_rank=max_lora_rank)
        log_dir = Path(log_dir) if log_dir is not None else Path.cwd()
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"vllm-server-{port}.log"
        server = cls(_spawn(command, env, log_path), port, log_path, command, env)
        try:
            await server._wait_healthy(config.startup_timeout_s)
        except BaseException:
            await server.stop()
            raise
        logger.info("vllm serve pid %d healthy at %s", server.pid, server.url)
        return server

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    async def restart(self, timeout_s: float = 300.0) -> None:
        """Start the same server again on the same port (after it died); wait for health.

        Whatever is left of the old one (its engine processes) is stopped first.
        """
        if not self.command:
            raise EngineError(f"{self.url} was not started by agentrl; it cannot restart it")
        await self.stop()
        self.restarts += 1
        logger.warning("restarting vllm serve at %s (restart %d)", self.url, self.restarts)
        self.process = _spawn(self.command, self.env, self.log_path)
        try:
            await self._wait_healthy(timeout_s)
        except BaseException:
            await self.stop()
            raise

    async def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession() as session:
            while True:
                if self.process.poll() is not None:
                    raise EngineStartupError(
                        f"vllm serve exited with code {self.process.returncode} before it "
                        f"became healthy; its log ({self.log_path}) ends with:\n{self.log_tail()}"
                    )
                if time.monotonic() > deadline:
                    raise EngineStartupError(
                        f"vllm serve at {self.url} was not healthy after {timeout_s} s "
                        f"(inference.startup_timeout_s); raise it or read {self.log_path}"
                    )
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    timeout = aiohttp.ClientTimeout(total=2)
                    async with session.get(f"{self.url}/health", timeout=timeout) as r:
                        if r.status == 200:
                            return
                # Polling is the only way to see a subprocess's HTTP port open.
                await asyncio.sleep(0.5)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the server and the engine processes it spawned. Safe to call twice."""
        if self.process.poll() is not None:
            # Died on its own: its engine processes may live on in its process group.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            return
        children = descendants(self.process.pid)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(self.process.wait, timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                await asyncio.to_thread(self.process.wait)
        # Engine processes that outlived their parent are ours too: end them by PID.
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    async def __aenter__(self) -> VLLMServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def server_command(
    model: str,
    config: InferenceConfig,
    port: int,
    host: str = "127.0.0.1",
    *,
    seed: int | None = None,
    max_lora_rank: int | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The ``vllm serve`` command line and environment agentrl's client needs.

    ``seed``: the sampler's seed (None: vLLM's default); ``max_lora_rank``: serve LoRA
    adapters up to this rank (None: no LoRA).

    Dev mode turns on the weight-update routes; runtime LoRA updating the adapter
    routes; ``processed_logprobs`` makes the behaviour logprobs those of the sampling
    distribution (after temperature).
    """
    model_path = resolve_model(model)
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model_path,
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        config.dtype,
        "--max-model-len",
        str(config.max_model_len),
        "--kv-cache-memory-bytes",
        str(config.kv_cache_bytes),
        "--max-num-seqs",
        str(config.max_num_seqs),
        "--logprobs-mode",
        "processed_logprobs",
        "--disable-log-stats",
    ]
    if seed is not None:
        command += ["--seed", str(seed)]
    if config.enforce_eager:
        command.append("--enforce-eager")
    if max_lora_rank is not None:
        command += ["--enable-lora", "--max-lora-rank", str(max_lora_rank)]
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    return command, env


def _spawn(command: Sequence[str], env: dict[str, str] | None, log_path: Path) -> Any:
    """Start ``command`` in its own session (process group), output appended to the log.

    The session keeps Ctrl-C in a terminal from reaching the server before agentrl
    stops it; the watchdog (:func:`agentrl.runtime.stopping.ensure_reaper`) stops it if
    agentrl dies without doing so.
    """
    ensure_reaper()
    # Its worker binds itself among the cores the server may use: all of this process's,
    # even while an in-process engine keeps this process off its own worker's.
    with open(log_path, "ab") as log, cores.every_core():
        return subprocess.Popen(
            list(command), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

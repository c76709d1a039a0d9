"""Train on an env served by another process: python run.py [--section.key=value ...]

1. Starts ``agentrl serve-env agentrl/GuessNumber-v0`` on 127.0.0.1 and a free port, in
   its own process, and waits for its ``/health``.
2. ``agentrl train config.toml --env.url=...``: every episode's env lives on that server
   (one WebSocket session each); the model, vLLM and the trainer stay here.
3. Stops the server (SIGTERM, by its PID) when training ends, fails or is interrupted.

See README.md next to this file for servers on other machines.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from agentrl.cli import main
from agentrl.runtime.net import free_port

ENV_ID = "agentrl/GuessNumber-v0"
STARTUP_TIMEOUT_S = 60.0


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def start_env_server(port: int) -> subprocess.Popen[bytes]:
    """``agentrl serve-env`` in a child process; returns once it answers ``/health``."""
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentrl.cli",
            "serve-env",
            ENV_ID,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
    )
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not healthy(url):
        if server.poll() is not None:
            raise SystemExit(f"agentrl serve-env exited ({server.returncode}) before it served")
        if time.monotonic() > deadline:
            stop(server)
            raise SystemExit(
                f"agentrl serve-env did not answer {url}/health in {STARTUP_TIMEOUT_S:g} s"
            )
        time.sleep(0.2)
    return server


def stop(server: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server by its PID; SIGKILL if it has not ended 10 s later."""
    if server.poll() is not None:
        return
    server.terminate()
    try:
        server.wait(10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def run(overrides: list[str]) -> int:
    port = free_port()
    server = start_env_server(port)
    print(f"env server: {ENV_ID} on http://127.0.0.1:{port} (pid {server.pid})", flush=True)
    try:
        config = str(Path(__file__).with_name("config.toml"))
        url = json.dumps(f"http://127.0.0.1:{port}")
        return main(["train", config, f"--env.url={url}", *overrides])
    finally:
        stop(server)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))

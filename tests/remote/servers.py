"""Env servers for the remote-env tests: ``agentrl serve-env`` and OpenEnv's echo server.

Each runs as a :class:`~tests.faults.harness.Proc` (its own process group, killed at the
end of the test whatever happened) on a free loopback port, and is returned once its
``/health`` answers.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from agentrl.runtime.net import free_port
from tests.faults.harness import AGENTRL, Proc, healthy, wait_until

ECHO_SERVER = Path(__file__).with_name("openenv_echo_server.py")
OPENENV = str(Path(sys.executable).parent / "openenv")


def serve_env(env_id: str, log_dir: Path, *args: str) -> tuple[Proc, str]:
    """``agentrl serve-env ENV_ID`` on a free port; the process and its URL."""
    port = free_port()
    log = log_dir / f"serve-env-{port}.log"
    proc = Proc([AGENTRL, "serve-env", env_id, "--port", str(port), *args], log)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: healthy(url), f"{env_id} on {url} to answer /health", 60, proc)
    return proc, url


def render_echo_env(out: Path) -> Path:
    """The env ``openenv init echo_env`` renders from openenv-core's template (offline)."""
    subprocess.run(
        [OPENENV, "init", "echo_env", "-o", str(out)], check=True, capture_output=True, timeout=60
    )
    return out / "echo_env"


def serve_echo_env(env_dir: Path, log_dir: Path) -> tuple[Proc, str]:
    """OpenEnv's echo env under OpenEnv's own server, on a free port."""
    port = free_port()
    log = log_dir / f"openenv-echo-{port}.log"
    proc = Proc([sys.executable, str(ECHO_SERVER), str(env_dir), "--port", str(port)], log)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: healthy(url), f"the OpenEnv echo server on {url}", 60, proc)
    return proc, url

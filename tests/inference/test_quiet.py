"""What the engine's processes print goes to the log without ``-v``, to the terminal with it.

The fast tests use a real child process; the slow one runs ``agentrl demo`` (the real
vLLM CPU engine, the tiny model) with and without ``-v``.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.inference.quiet import ENGINE_LOG, engine_stderr, is_quiet, stderr_to

ROOT = Path(__file__).resolve().parents[2]
CHILD = "import sys, time; time.sleep(0.5); print('from the child', file=sys.stderr)"

NOISE = (
    "Triton is installed, but doesn't include CPU backend",  # vLLM, before its logging is set
    "torch.distributed.reduce_op` is deprecated",  # a FutureWarning inside vLLM
    "NUMA binding: Using MEMBIND policy",  # vLLM's C++ CPU worker, on fd 2
)
"""Start-up lines of vLLM's processes a user can do nothing about (the CPU build)."""


@pytest.fixture
def vllm_level() -> Iterator[logging.Logger]:
    logger = logging.getLogger("vllm")
    level = logger.level
    yield logger
    logger.setLevel(level)


@pytest.mark.timeout(60)
def test_stderr_to_sends_a_child_to_the_log_for_its_life_and_restores_this_process(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "logs" / "engine.log"
    with stderr_to(log):
        child = subprocess.Popen([sys.executable, "-c", CHILD])
        os.write(2, b"inside\n")
    os.write(2, b"after\n")
    assert child.wait(timeout=30) == 0  # it writes after the block has ended
    err = capfd.readouterr().err
    assert "after" in err and "inside" not in err and "from the child" not in err
    assert log.read_text().splitlines() == ["inside", "from the child"]


@pytest.mark.timeout(30)
def test_engine_stderr_follows_vllms_logging(
    tmp_path: Path, vllm_level: logging.Logger, capfd: pytest.CaptureFixture[str]
) -> None:
    vllm_level.setLevel(logging.ERROR)  # what `agentrl` without -v sets
    assert is_quiet()
    with engine_stderr(tmp_path) as log:
        os.write(2, b"quiet\n")
    assert log == tmp_path / ENGINE_LOG and log.read_text() == "quiet\n"
    with engine_stderr(None) as log:  # no folder: nowhere else to go
        os.write(2, b"no folder\n")
    vllm_level.setLevel(logging.NOTSET)  # left alone (-v, or a program of its own)
    assert not is_quiet()
    with engine_stderr(tmp_path) as log:
        os.write(2, b"loud\n")
    assert log is None and (tmp_path / ENGINE_LOG).read_text() == "quiet\n"
    assert capfd.readouterr().err == "no folder\nloud\n"


def _demo(cwd: Path, model_cache: Path, *flags: str) -> str:
    cwd.mkdir()
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "AGENTRL_CACHE": str(model_cache), "PYTHONPATH": path}
    env.pop("VLLM_CONFIGURE_LOGGING", None)  # as in a user's shell (conftest sets it)
    out = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", *flags, "demo", "--max-tokens", "4"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=cwd,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "12 tokens in" in out.stdout, out.stdout  # three answers of 4 tokens
    return out.stdout + out.stderr


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_demo_prints_vllms_start_up_noise_only_with_v(tmp_path: Path, model_cache: Path) -> None:
    loud = _demo(tmp_path / "verbose", model_cache, "-v")
    seen = [line for line in NOISE if line in loud]
    assert seen, f"none of {NOISE} with -v: did vLLM change what it prints?\n{loud[-3000:]}"
    quiet = _demo(tmp_path / "default", model_cache)
    assert [line for line in NOISE if line in quiet] == [], quiet
    log = (tmp_path / "default" / ".agentrl-logs" / ENGINE_LOG).read_text()
    assert [line for line in seen if line not in log] == [], log

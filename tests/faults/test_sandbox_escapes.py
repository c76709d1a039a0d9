"""The escape suite: each attack of :mod:`tests.faults.escapes` runs through the
``python`` tool as a model calls it (``ToolSet.call``), once per sandbox mechanism.

The audit hook is off (``SandboxPolicy(audit_hook=False)``) except for the attacks on
the hook itself, so what holds is the OS layer: namespaces, read-only mounts, the
size- and inode-limited tmpfs, seccomp, rlimits. For every attack the test checks on
the host that its effect did not happen, that the episode goes on (the call comes back
as text, not as a tool error), that the secret reached no output, and that nothing the
call started outlives it. ``bwrap`` and ``unshare`` must stop every attack;
``process`` (no OS isolation: the fallback) runs only the attacks it claims to stop.
A mechanism this machine cannot run is skipped, with the probe's reason.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agentrl.runtime.stopping import descendants
from agentrl.sandbox import SandboxLimits, SandboxPolicy, probe
from agentrl.sandbox.isolation import environment
from agentrl.tools import ToolCall, ToolSet
from tests.faults.escapes import ATTACKS, ROOT, Attack, Host
from tools.python_sandbox import python_tool

LIMITS = SandboxLimits(
    wall_s=3.0, cpu_s=1, max_disk_bytes=4 * 2**20, max_files=512, max_output_bytes=4096
)
CASES = [
    pytest.param(mechanism, attack, id=f"{mechanism}-{i:02d}")
    for i, attack in enumerate(ATTACKS)
    for mechanism in ("bwrap", "unshare", "process")
    if mechanism != "process" or attack.process
]


def _shadow_line() -> str:
    try:
        return Path("/etc/shadow").read_text().splitlines()[0]
    except (OSError, IndexError):
        return "root:"  # not readable here: any line of it would start so


def _env_markers() -> list[str]:
    """``KEY=VALUE`` entries of this process's initial environment a run must not see."""
    inside = set(environment("/sandbox")) | {"PWD", "SHLVL", "_"}
    entries = Path(f"/proc/{os.getpid()}/environ").read_bytes().split(b"\0")
    pairs = [e.decode(errors="replace") for e in entries if b"=" in e]
    return [p for p in pairs if p.split("=", 1)[0] not in inside and len(p.split("=", 1)[1]) > 3]


def _listening(kind: int, address: str | tuple[str, int]) -> socket.socket:
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    sock = socket.socket(family, kind)
    sock.bind(address)
    if kind == socket.SOCK_STREAM:
        sock.listen(8)
    return sock


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    secret = f"hunter2-{secrets.token_hex(8)}"
    monkeypatch.setenv("AGENTRL_TEST_SECRET", secret)
    short = Path(tempfile.mkdtemp(prefix="sbx-"))  # a Unix socket path has 108 bytes
    received: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: received.append(signum))
    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
    made = Host(
        dir=tmp_path,
        secret=secret,
        token=secrets.token_hex(4),
        victim_file=tmp_path / "precious.txt",
        tcp=_listening(socket.SOCK_STREAM, ("127.0.0.1", 0)),
        udp=_listening(socket.SOCK_DGRAM, ("127.0.0.1", 0)),
        unix=_listening(socket.SOCK_STREAM, str(short / "agent.sock")),
        unix_path=short / "agent.sock",
        victim=victim,
        signals=received,
        shadow_line=_shadow_line(),
        env_markers=_env_markers(),
    )
    made.victim_file.write_text("precious")
    made.victim_file.chmod(0o644)
    for path in made.planted:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"-----BEGIN KEY----- {secret}\n")
    try:
        yield made
    finally:
        signal.signal(signal.SIGUSR1, previous)
        victim.kill()
        victim.wait()
        for sock in (made.tcp, made.udp, made.unix):
            sock.close()
        for path in made.outside_paths:  # only there if an attack got out
            if os.path.isfile(path):
                os.remove(path)
        made.unix_path.unlink(missing_ok=True)
        short.rmdir()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("mechanism", "attack"), CASES)
async def test_attack_is_contained(
    mechanism: str, attack: Attack, host: Host, record_fault: Callable[..., None]
) -> None:
    reason = probe(mechanism)  # type: ignore[arg-type]
    if reason is not None:
        pytest.skip(f"{mechanism} cannot run here: {reason}")
    policy = SandboxPolicy(isolation=mechanism, audit_hook=attack.hook)  # type: ignore[arg-type]
    tools = ToolSet([python_tool(policy, LIMITS)], timeout_s=30.0)
    before = set(descendants(os.getpid()))
    started = time.monotonic()

    result = await tools.call(ToolCall("python", {"code": attack.program(host)}))

    elapsed = time.monotonic() - started
    out = result.content
    breaches = attack.breaches(out, host)
    if host.secret in out:
        breaches.append("the secret reached the output")
    left = set(descendants(os.getpid())) - before
    if left:
        breaches.append(f"processes outlived the call: {sorted(left)}")
    if result.error is not None or elapsed > LIMITS.wall_s + 5:
        breaches.append(f"the episode could not go on: {result.error} after {elapsed:.1f} s")
    record_fault(
        f"sandbox escape ({mechanism}): {attack.name}",
        injected=1,
        survived=int(not breaches),
        lost=0,
    )
    assert not breaches, f"{attack.name} got out of {mechanism}: {breaches}\n{out[-2000:]}"


def _python_for(uid: int) -> str | None:
    """An interpreter of this Python version that ``uid`` can start: this one when it
    can (a system Python), else the distribution's (pyenv keeps its own under /root)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (
        sys.executable,
        os.path.realpath(sys.executable),
        f"/usr/bin/python{version}",
        f"/usr/local/bin/python{version}",
    ):
        try:
            said = subprocess.run(
                [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=30,
                user=uid,
                group=uid,
                extra_groups=[],
                cwd="/",
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if said.returncode == 0 and said.stdout.strip() == version:
            return candidate
    return None


@pytest.mark.skipif(os.geteuid() != 0, reason="run as root: it re-runs the suite as uid 65534")
def test_the_suite_holds_as_an_unprivileged_user() -> None:
    """The whole suite again as uid 65534 (not root: the sandbox is then built in user
    namespaces of that uid, the path a user's laptop takes), every case run, none
    skipped. The venv's packages are reached by PYTHONPATH from a system interpreter
    of the same version when the venv's own sits where that uid cannot go."""
    nobody = 65534
    python = _python_for(nobody)
    if python is None:
        pytest.skip(f"no Python {sys.version_info[:2]} that uid {nobody} can start")
    site = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]
    path = os.pathsep.join([str(ROOT), *site])
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": tempfile.gettempdir(),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPATH": path,
    }
    done = subprocess.run(
        [
            python,
            "-m",
            "pytest",
            "-q",
            "-rfs",
            "--tb=short",
            "-p",
            "no:cacheprovider",
            "-k",
            "contained",
            str(ROOT / "tests/faults/test_sandbox_escapes.py"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        user=nobody,
        group=nobody,
        extra_groups=[],
        cwd=str(ROOT),
        env=env,
    )
    said = done.stdout + done.stderr  # without the fault table's rows
    tail = "\n".join(line for line in said.splitlines() if not line.startswith("|"))[-4000:]
    assert done.returncode == 0, tail
    expected = len(CASES)
    assert f"{expected} passed" in tail and "skipped" not in tail, tail

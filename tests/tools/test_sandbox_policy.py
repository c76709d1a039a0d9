"""Which isolation the sandbox uses, how it says so, and refusing to run without it."""

from __future__ import annotations

import logging
import socket

import pytest

from agentrl.sandbox import (
    MECHANISMS,
    SandboxLimits,
    SandboxPolicy,
    SandboxUnavailableError,
    probe,
    resolve,
    runner,
)
from agentrl.sandbox.inside import ARCHES, seccomp_program
from agentrl.tools import ToolCall, ToolSet
from tools.python_sandbox import python_tool, run_python

LIMITS = SandboxLimits(wall_s=5.0, cpu_s=2, max_output_bytes=4096)


@pytest.fixture
def no_os_isolation(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine where neither bubblewrap nor unshare works."""
    failing = {"bwrap": "bwrap is not installed", "unshare": "unshare exited with 1: denied"}
    monkeypatch.setattr(runner, "probe", lambda mechanism: failing.get(mechanism))
    monkeypatch.delenv("AGENTRL_SANDBOX", raising=False)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_each_mechanism_runs_a_program_and_says_which_it_is(
    mechanism: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    reason = probe(mechanism)  # type: ignore[arg-type]
    if reason is not None:
        pytest.skip(f"{mechanism} cannot run here: {reason}")
    code = "import os\nprint(sum(range(10)), os.getcwd() == os.environ['HOME'])"
    monkeypatch.setenv("AGENTRL_SANDBOX", mechanism)  # the switch that forces a fallback
    result = await run_python(code, LIMITS)
    assert (result.mechanism, result.returncode, result.output) == (mechanism, 0, "45 True\n")


async def test_auto_picks_the_best_mechanism_that_works(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTRL_SANDBOX", raising=False)
    working = [m for m in MECHANISMS if probe(m) is None]
    assert resolve(SandboxPolicy()) == working[0]
    assert (await run_python("print(1)", LIMITS)).mechanism == working[0]


async def test_without_os_isolation_it_falls_back_and_warns(
    no_os_isolation: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="agentrl.sandbox.runner"):
        result = await run_python("print(6 * 7)", LIMITS)
    assert (result.mechanism, result.output) == ("process", "42\n")
    warning = caplog.text
    assert "no OS isolation available" in warning and "apt-get install bubblewrap" in warning
    assert "bwrap is not installed" in warning and "AGENTRL_SANDBOX=os" in warning


@pytest.mark.parametrize("how", ["policy", "environment"])
async def test_it_refuses_to_run_without_os_isolation_when_told(
    how: str, no_os_isolation: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = SandboxPolicy(isolation="os") if how == "policy" else SandboxPolicy()
    if how == "environment":
        monkeypatch.setenv("AGENTRL_SANDBOX", "os")
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
        await run_python("print(1)", LIMITS, policy)
    # As a model calls it: the episode gets the error as a tool message, counted.
    tools = ToolSet([python_tool(policy, LIMITS)])
    result = await tools.call(ToolCall("python", {"code": "print(1)"}))
    assert result.error == "tool_exception" and "no OS isolation" in result.content


async def test_a_bad_setting_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRL_SANDBOX", "docker")
    with pytest.raises(SandboxUnavailableError, match="AGENTRL_SANDBOX='docker'"):
        resolve(SandboxPolicy())
    with pytest.raises(ValueError, match=r"SandboxPolicy\.isolation is 'docker'"):
        SandboxPolicy(isolation="docker")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"SandboxLimits\.wall_s must be > 0"):
        SandboxLimits(wall_s=0)


def test_a_missing_program_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner.shutil, "which", lambda name: None)
    assert probe.__wrapped__("bwrap") == "bwrap is not installed"  # type: ignore[attr-defined]


@pytest.mark.timeout(60)
async def test_network_only_when_the_policy_allows_it() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {server.getsockname()[1]}))"
    try:
        closed = await run_python(code, LIMITS)
        server.settimeout(0.3)
        with pytest.raises(TimeoutError):
            server.accept()
        opened = await run_python(code, LIMITS, SandboxPolicy(network=True))
        server.settimeout(2.0)
        server.accept()[0].close()
    finally:
        server.close()
    assert closed.returncode == 1 and opened.returncode == 0, (closed, opened)


@pytest.mark.parametrize("machine", sorted(ARCHES))
def test_the_seccomp_filter_is_well_formed(machine: str) -> None:
    for network in (False, True):
        rows = seccomp_program(machine, 2, network)
        assert rows is not None and rows[-1] == (0x06, 0, 0, 0x7FFF0000)  # ends in ALLOW
        assert rows[1][3] == ARCHES[machine][0]  # the architecture is checked first
        for i, (code, jt, jf, _) in enumerate(rows):
            if code & 0x07 == 0x05:  # a jump: both targets inside the program
                assert i + 1 + max(jt, jf) < len(rows), (machine, i)
        assert len(rows) < 4096  # BPF_MAXINSNS
    assert seccomp_program("riscv64", 2, False) is None

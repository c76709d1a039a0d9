"""Which isolation the sandbox uses, how it says so, and refusing to run without it."""

from __future__ import annotations

import argparse
import logging
import socket

import pytest

from agentrl import check
from agentrl.check import tool_sandboxes
from agentrl.cli.misc import _check_env
from agentrl.sandbox import (
    MECHANISMS,
    OS_MECHANISMS,
    SandboxLimits,
    SandboxPolicy,
    SandboxUnavailableError,
    probe,
    resolve,
    runner,
    tool_policy,
)
from agentrl.sandbox.inside import ARCHES, seccomp_program
from agentrl.tools import Tool, ToolCall, ToolSet
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


async def test_the_default_picks_the_best_os_mechanism_that_works(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AGENTRL_SANDBOX", raising=False)
    working = [m for m in OS_MECHANISMS if probe(m) is None]
    if not working:
        with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
            resolve(SandboxPolicy())
        return
    assert resolve(SandboxPolicy()) == working[0]
    assert (await run_python("print(1)", LIMITS)).mechanism == working[0]


@pytest.mark.parametrize("how", ["default", "policy", "environment", "policy-over-environment"])
async def test_without_os_isolation_it_refuses_to_run_unless_allowed(
    how: str, no_os_isolation: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = SandboxPolicy(isolation="os") if how.startswith("policy") else SandboxPolicy()
    if how != "default":  # an env's explicit "os" is not weakened by the environment
        monkeypatch.setenv("AGENTRL_SANDBOX", "os" if how == "environment" else "process")
    with pytest.raises(SandboxUnavailableError) as refused:
        await run_python("print(1)", LIMITS, policy)
    message = str(refused.value)
    assert "bwrap is not installed" in message and "unshare exited with 1" in message
    assert "apt-get install bubblewrap" in message and "user namespaces" in message
    assert "AGENTRL_SANDBOX=fallback" in message and "AGENTRL_SANDBOX=process" in message
    # As a model calls it: the episode gets the error as a tool message, counted.
    tools = ToolSet([python_tool(policy, LIMITS)])
    result = await tools.call(ToolCall("python", {"code": "print(1)"}))
    assert result.error == "tool_exception" and "no OS isolation" in result.content


@pytest.mark.parametrize("how", ["environment", "policy", "process"])
async def test_the_weaker_mode_runs_when_allowed_explicitly(
    how: str,
    no_os_isolation: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy = SandboxPolicy(isolation="fallback") if how == "policy" else SandboxPolicy()
    if how != "policy":
        monkeypatch.setenv("AGENTRL_SANDBOX", "fallback" if how == "environment" else "process")
    runner._announce.cache_clear()  # it logs once per process and setting
    with caplog.at_level(logging.WARNING, logger="agentrl.sandbox.runner"):
        result = await run_python("print(6 * 7)", LIMITS, policy)
    assert (result.mechanism, result.output) == ("process", "42\n")
    assert "NO OS isolation" in caplog.text
    if how != "process":  # fallback says why and what would fix it
        assert (
            "no OS isolation available" in caplog.text and "bwrap is not installed" in caplog.text
        )
        assert "apt-get install bubblewrap" in caplog.text


async def test_a_bad_setting_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    for value in ("docker", "auto"):  # auto is the policy's default, not a setting
        monkeypatch.setenv("AGENTRL_SANDBOX", value)
        with pytest.raises(SandboxUnavailableError, match=f"AGENTRL_SANDBOX='{value}'"):
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


def test_tools_that_run_code_carry_their_policy() -> None:
    from tools.calculator import calculator
    from tools.python_sandbox import python

    strict = SandboxPolicy(isolation="os", network=True)
    assert tool_policy(python) == SandboxPolicy()
    assert tool_policy(python_tool(strict)) == strict
    assert tool_policy(Tool(python_tool(strict))) == strict  # as a ToolSet holds it
    assert tool_policy(calculator) is None


@pytest.mark.timeout(60)
def test_check_env_reports_the_mode_of_an_envs_code_tools(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("AGENTRL_SANDBOX", raising=False)
    working = [m for m in OS_MECHANISMS if probe(m) is None]
    (found,) = tool_sandboxes("agentrl/PythonPuzzle-v0")
    assert found.tool == "python"
    assert found.mechanism == (working[0] if working else None), found
    assert tool_sandboxes("agentrl/Calculator-v0") == []  # no tool that runs code
    # What `agentrl check-env` prints (the env's rules are tested in tests/test_check.py).
    monkeypatch.setattr(check, "check_env", lambda env_id, **options: [])
    _check_env(
        argparse.Namespace(
            env_id="agentrl/PythonPuzzle-v0", imports=[], example_actions=[], kwargs={}
        ),
        [],
    )
    if working:
        assert f"INFO  tool python          {working[0]}: " in capsys.readouterr().out


def test_check_env_says_when_a_tool_refuses_to_run(
    no_os_isolation: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (found,) = tool_sandboxes("agentrl/PythonPuzzle-v0")
    assert found.mechanism is None and "apt-get install bubblewrap" in found.detail
    monkeypatch.setenv("AGENTRL_SANDBOX", "fallback")
    (found,) = tool_sandboxes("agentrl/PythonPuzzle-v0")
    assert found.mechanism == "process" and "NO OS isolation" in found.detail
    monkeypatch.delenv("AGENTRL_SANDBOX")
    monkeypatch.setattr(check, "check_env", lambda env_id, **options: [])
    _check_env(
        argparse.Namespace(
            env_id="agentrl/PythonPuzzle-v0", imports=[], example_actions=[], kwargs={}
        ),
        [],
    )
    assert "WARN  tool python          refuses to run here: no OS isolation" in (
        capsys.readouterr().out
    )

"""The Python sandbox contains attacks; the test process survives each one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.python_sandbox import SandboxLimits, python, run_python

LIMITS = SandboxLimits(wall_s=3.0, cpu_s=2, max_output_bytes=4096)


async def test_ordinary_code_runs_in_its_own_directory() -> None:
    assert await python("print(sum(range(10)))") == "45"
    result = await run_python("open('f.txt','w').write('hi'); import os; print(os.listdir('.'))")
    assert result.returncode == 0 and "f.txt" in result.output


async def test_infinite_loop_is_killed() -> None:
    result = await run_python("while True: pass", LIMITS)
    assert result.returncode != 0
    assert result.timed_out or result.returncode == -9 or "SIGXCPU" in result.as_text()


async def test_sleeping_forever_hits_the_wall_clock() -> None:
    result = await run_python("import time; time.sleep(60)", LIMITS)
    assert result.timed_out and "wall-clock" in result.as_text()


async def test_fork_bomb_is_refused() -> None:
    code = "import os\nwhile True:\n    os.fork()"
    result = await run_python(code, LIMITS)
    assert result.returncode == 1 and "os.fork is not allowed" in result.output


async def test_memory_hog_gets_memory_error() -> None:
    result = await run_python("x = bytearray(4 * 1024**3)\nprint('allocated')", LIMITS)
    assert "MemoryError" in result.output and "allocated" not in result.output


async def test_parent_environment_is_not_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRL_TEST_SECRET", "hunter2")
    code = (
        "import os\nprint(sorted(os.environ))\n"
        "print(open(f'/proc/{os.getppid()}/environ', 'rb').read())"
    )
    result = await run_python(code, LIMITS)
    assert "hunter2" not in result.output and "AGENTRL_TEST_SECRET" not in result.output
    assert "reading other processes is not allowed" in result.output


async def test_writing_outside_the_directory_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "escaped.txt"
    for code in (
        f"open({str(target)!r}, 'w').write('x')",
        f"import os; os.mkdir({str(tmp_path / 'newdir')!r})",
        f"import shutil; open('a','w').close(); shutil.move('a', {str(target)!r})",
    ):
        result = await run_python(code, LIMITS)
        assert "PermissionError: sandbox" in result.output, code
    assert not target.exists() and not (tmp_path / "newdir").exists()


async def test_huge_output_is_capped() -> None:
    result = await run_python("print('x' * 100_000_000)", LIMITS)
    assert result.output_truncated and len(result.output) <= LIMITS.max_output_bytes
    assert "(output truncated)" in result.as_text()


async def test_network_and_programs_are_refused() -> None:
    net = await run_python("import socket; socket.create_connection(('127.0.0.1', 9))", LIMITS)
    assert "no network" in net.output or "not allowed" in net.output
    prog = await run_python("import subprocess; subprocess.run(['true'])", LIMITS)
    assert "subprocess.Popen is not allowed" in prog.output

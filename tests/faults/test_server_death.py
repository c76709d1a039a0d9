"""`vllm serve` dies under a running `agentrl train` (HTTP mode, a server it did not start).

* Started again: the client retries with bounded backoff, the run's requests wait for
  it, it is brought to the current weights, and the run finishes with nothing lost.
* Never back: requests wait ``inference.reconnect_timeout_s``, then the run stops with
  one clear message; the store is intact, and once a server is back ``--resume``
  finishes the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentrl.inference.server import free_port
from tests.faults.harness import (
    AGENTRL,
    Proc,
    agentrl_env,
    audit,
    consumed_steps,
    digits_config,
    healthy,
    wait_until,
)

STEPS = 8

pytestmark = [pytest.mark.soak, pytest.mark.vllm, pytest.mark.timeout(1200)]


def _serve(config: Path, port: int, log: Path, env: dict[str, str]) -> Proc:
    server = Proc([AGENTRL, "serve", str(config), "--port", str(port)], log, env)
    wait_until(lambda: healthy(f"http://127.0.0.1:{port}"), "vllm serve to be healthy", 300, server)
    return server


def _train(
    config: Path, run_dir: Path, url: str, reconnect_s: int, log: Path, env: dict[str, str]
) -> Proc:
    return Proc(
        [
            AGENTRL,
            "train",
            str(config),
            f'--run.out="{run_dir}"',
            '--inference.mode="server"',
            f'--inference.servers=["{url}"]',
            f"--inference.reconnect_timeout_s={reconnect_s}",
        ],
        log,
        env,
    )


def test_server_killed_and_started_again_the_run_finishes(
    tmp_path: Path, model_cache: Path, record_fault: Any
) -> None:
    env = agentrl_env(model_cache)
    config, run_dir, port = digits_config(tmp_path, STEPS), tmp_path / "run", free_port()
    url = f"http://127.0.0.1:{port}"
    server = _serve(config, port, tmp_path / "serve-1.log", env)
    train = _train(config, run_dir, url, 300, tmp_path / "train.log", env)
    try:
        wait_until(lambda: consumed_steps(run_dir) >= 2, "two steps", 400, train)
        server.kill()
        wait_until(lambda: "is down" in train.text(), "the client to notice", 60, train)
        server = _serve(config, port, tmp_path / "serve-2.log", env)
        rc = train.wait(600)
    finally:
        train.kill()
        server.kill()
    end = audit(run_dir)
    record_fault(
        "`vllm serve` SIGKILLed mid-run, started again",
        injected=1,
        survived=int(rc == 0 and end["ok"]),
        lost=len(end["lost"]),
        trained_twice=len(end["trained_twice"]),
    )
    log = train.text()
    assert rc == 0, train.tail()
    assert "is back, at version" in log, train.tail()
    assert end["integrity"] == "ok" and end["ok"], end
    assert end["consumed_steps"] == STEPS


def test_server_that_never_comes_back_stops_the_run_clearly_and_resume_works(
    tmp_path: Path, model_cache: Path, record_fault: Any
) -> None:
    env = agentrl_env(model_cache)
    config, run_dir, port = digits_config(tmp_path, STEPS), tmp_path / "run", free_port()
    url = f"http://127.0.0.1:{port}"
    server = _serve(config, port, tmp_path / "serve-1.log", env)
    train = _train(config, run_dir, url, 15, tmp_path / "train.log", env)
    try:
        wait_until(lambda: consumed_steps(run_dir) >= 2, "two steps", 400, train)
        server.kill()
        rc = train.wait(300)
    finally:
        train.kill()
        server.kill()
    stopped = audit(run_dir)
    errors = [ln for ln in train.text().splitlines() if ln.startswith("agentrl: error:")]

    server = _serve(config, port, tmp_path / "serve-2.log", env)
    try:
        again = Proc([AGENTRL, "train", "--resume", str(run_dir)], tmp_path / "resume.log", env)
        rc_resume = again.wait(600)
    finally:
        server.kill()
    end = audit(run_dir)
    record_fault(
        "`vllm serve` SIGKILLed, never back (then --resume)",
        injected=1,
        survived=int(rc_resume == 0 and end["ok"]),
        lost=len(stopped["lost"]) + len(end["lost"]),
        trained_twice=len(end["trained_twice"]),
    )

    assert rc == 1, train.tail()
    assert len(errors) == 1, train.tail()  # one clear error, no traceback
    assert errors[0].startswith("agentrl: error: no inference server answered for 15 s")
    assert url in errors[0] and f"agentrl train --resume {run_dir}" in errors[0]
    assert "Traceback" not in train.text()
    assert stopped["integrity"] == "ok" and stopped["ok"], stopped
    assert rc_resume == 0, again.tail()
    assert end["ok"] and end["consumed_steps"] == STEPS

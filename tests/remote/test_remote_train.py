"""An env server dies under a running `agentrl train` that spreads episodes over two.

Two ``agentrl serve-env agentrl/GuessNumber-v0`` processes serve one run (``[env] id``
and ``urls``). Once the run has made an optimizer step and both servers hold sessions,
one server is SIGKILLed. Only its episodes fail (``env_unavailable``, kept in the store
as retried attempts); they run again on the other server, and the run finishes with
every task trained once and nothing lost.
"""

from __future__ import annotations

import json
import sqlite3
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from agentrl.runtime.net import free_port
from tests.faults.harness import (
    AGENTRL,
    Proc,
    agentrl_env,
    audit,
    consumed_steps,
    healthy,
    wait_until,
)

ENV_ID = "agentrl/GuessNumber-v0"
STEPS = 6
GROUPS_PER_STEP = 4

CONFIG = """
[run]
name = "remote-env-faults"
[env]
id = "{env_id}"
urls = {urls}
[rollout]
group_size = 4
concurrency = 16
max_turns = 4
max_tokens_per_turn = 8
[train]
steps = {steps}
groups_per_step = {groups}
checkpoint_every = 2
[eval]
episodes = 0
[log]
progress = "plain"
plots = false
"""

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]


def _serve_env(log: Path, env: dict[str, str]) -> tuple[Proc, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = Proc([AGENTRL, "serve-env", ENV_ID, "--port", str(port)], log, env)
    wait_until(lambda: healthy(url), f"agentrl serve-env on {url} to be healthy", 60, server)
    return server, url


def _sessions(url: str) -> int:
    """Sessions open on an agentrl env server now (-1: it does not answer)."""
    try:
        with urllib.request.urlopen(f"{url}/agentrl", timeout=2) as r:
            return int(json.load(r)["sessions"])
    except OSError:
        return -1


def _failed_attempts(run_dir: Path) -> list[tuple[str, int, str, str]]:
    """(episode id, attempt, state, reason) of every attempt that failed as env_unavailable."""
    conn = sqlite3.connect(run_dir / "episodes.db", timeout=5)
    try:
        return conn.execute(
            "SELECT episode_id, attempt, state, reason FROM episodes "
            "WHERE reason LIKE 'env_unavailable%' ORDER BY episode_id, attempt"
        ).fetchall()
    finally:
        conn.close()


def _later_attempts(run_dir: Path, episode_id: str, attempt: int) -> list[str]:
    conn = sqlite3.connect(run_dir / "episodes.db", timeout=5)
    try:
        rows = conn.execute(
            "SELECT state FROM episodes WHERE episode_id = ? AND attempt > ?",
            (episode_id, attempt),
        ).fetchall()
        return [r[0] for r in rows]
    finally:
        conn.close()


def test_env_server_killed_mid_run_its_episodes_are_retried_on_the_other(
    tmp_path: Path, model_cache: Path, record_fault: Any
) -> None:
    env = agentrl_env(model_cache)
    doomed, doomed_url = _serve_env(tmp_path / "serve-env-1.log", env)
    survivor, survivor_url = _serve_env(tmp_path / "serve-env-2.log", env)
    config, run_dir = tmp_path / "remote.toml", tmp_path / "run"
    config.write_text(
        CONFIG.format(
            env_id=ENV_ID,
            urls=json.dumps([doomed_url, survivor_url]),
            steps=STEPS,
            groups=GROUPS_PER_STEP,
        )
    )
    train = Proc(
        [AGENTRL, "train", str(config), f'--run.out="{run_dir}"'], tmp_path / "train.log", env
    )
    try:
        wait_until(
            lambda: (
                consumed_steps(run_dir) >= 1
                and _sessions(doomed_url) > 0
                and _sessions(survivor_url) > 0
            ),
            "a step, and episodes in flight on both env servers",
            300,
            train,
        )
        step_at_kill = consumed_steps(run_dir)
        doomed.kill()
        rc = train.wait(300)
    finally:
        train.kill()
        doomed.kill()
        survivor.kill()
    end = audit(run_dir)
    failed = _failed_attempts(run_dir)
    record_fault(
        "`agentrl serve-env` SIGKILLed mid-run (1 of 2 env servers)",
        injected=1,
        survived=int(rc == 0 and end["ok"]),
        lost=len(end["lost"]),
        trained_twice=len(end["trained_twice"]),
    )

    log = train.text()
    assert rc == 0, train.tail()
    assert step_at_kill < STEPS, f"the kill came after the last step ({step_at_kill})"
    assert f"env server {doomed_url} is down" in log, train.tail()
    assert "Traceback" not in log, train.tail()
    assert end["integrity"] == "ok" and end["ok"], end
    assert end["lost"] == [] and end["trained_twice"] == [], end
    assert end["consumed_steps"] == STEPS
    assert end["trained_tasks"] == STEPS * GROUPS_PER_STEP
    assert failed, "no episode failed with env_unavailable: the kill hit no episode"
    for episode_id, attempt, state, reason in failed:
        assert state == "retried", (episode_id, attempt, state, reason)
        assert doomed_url in reason, reason  # only the killed server's episodes failed
        later = _later_attempts(run_dir, episode_id, attempt)
        assert later and "retried" not in later, (episode_id, attempt, later)

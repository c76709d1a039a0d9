"""The live view against a real ``agentrl train`` (real vLLM, the tiny model): an
in-flight episode appears on the run page without a reload, leaves the live table,
and its own page then shows it ended."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from agentrl.monitor import read_status
from agentrl.store import FINAL_STATES, EpisodeStore
from agentrl.trainer.tokenrecord import read_record
from tests.faults.harness import Proc
from tests.view.conftest import Viewer

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

AGENTRL = str(Path(sys.executable).parent / "agentrl")
CONFIG = """
[run]
name = "live"
[env]
id = "agentrl/Digits-v0"
[rollout]
group_size = 4
concurrency = 16
max_turns = 1
max_tokens_per_turn = 16
max_staleness = 2
[train]
steps = 40
groups_per_step = 2
checkpoint_every = 100
[eval]
episodes = 4
[log]
progress = "plain"
status_every_s = 0.1
plots = false
tensorboard = false
"""


def test_an_in_flight_episode_appears_and_ends_without_a_reload(
    tmp_path: Path, model_cache: Path, browser: Any
) -> None:
    run_dir = tmp_path / "runs" / "live"
    config = tmp_path / "live.toml"
    config.write_text(CONFIG)
    env = {**os.environ, "AGENTRL_CACHE": str(model_cache)}
    train = Proc(
        [AGENTRL, "train", str(config), f'--run.out="{run_dir}"'], tmp_path / "train.log", env=env
    )
    deadline = time.monotonic() + 400
    while (read_status(run_dir) or {}).get("state") != "training":
        assert train.poll() is None, (tmp_path / "train.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "the run never started training"
        time.sleep(0.2)
    viewer = Viewer([str(tmp_path / "runs")], tmp_path / "view.log")
    try:
        page = browser.new_context(bypass_csp=True).new_page()
        page.set_default_timeout(120_000)
        page.goto(f"{viewer.url}#/run?run=live")
        assert page.wait_for_selector("#run-status").inner_text() == "running"
        first = page.wait_for_selector("tr.live-episode").get_attribute("data-episode")
        page.evaluate("window.marker = 1")  # gone if the page reloads
        page.wait_for_selector(f"tr.live-episode[data-episode='{first}']", state="detached")
        assert page.evaluate("window.marker") == 1
        page.goto(f"{viewer.url}#/episode?run=live&id={quote(first, safe='')}")
        for _ in range(60):  # ended, or parked by a weight update and resumed: wait for its end
            state = page.wait_for_selector("#episode-state").inner_text()
            if state in FINAL_STATES:
                break
            time.sleep(1)
            page.reload()
        assert state in FINAL_STATES, f"{first} is still {state}"
        assert page.locator("#tokens .tok").count() > 0
        trained = _a_trained_episode(run_dir)
        record = read_record(run_dir, trained, 0)
        assert record and len(record[0]["advantage"]) > 1  # the trainer's per-token record
        page.goto(f"{viewer.url}#/episode?run=live&id={quote(trained, safe='')}&attempt=0")
        page.select_option("#overlay", "advantage")  # offered: the record is there
    finally:
        viewer.stop()


def _a_trained_episode(run_dir: Path) -> str:
    """An episode (attempt 0) of the first optimizer step, once there is one."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        with EpisodeStore.open(run_dir, create=False) as store:
            consumed = [c for c in store.consumed() if c["segment"] == 0]
            attempts = {(r["episode_id"], r["attempt"]) for r in store.episodes()}
        for c in consumed:
            if (c["episode_id"], 0) in attempts and (c["episode_id"], 1) not in attempts:
                return str(c["episode_id"])
        time.sleep(0.5)
    raise AssertionError("no optimizer step in 300 s")

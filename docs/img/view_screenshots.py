"""Remake the screenshots of docs/guides/viewer.md (viewer-*.png here).

    PYTHONPATH=. python docs/img/view_screenshots.py

Builds the test run directory of tests/view (the store's API, the tiny model's
tokenizer), serves it with ``agentrl view``, and photographs the run page, an episode
with the version overlay, and the live view in the OS's headless Chromium.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

from playwright.sync_api import sync_playwright
from transformers import AutoTokenizer

from agentrl.models import resolve_model
from tests.view.conftest import CHROMIUM, CHROMIUM_ARGS, Viewer
from tests.view.runs import build_runs

HERE = Path(__file__).resolve().parent


def main() -> None:
    model = resolve_model("tiny")
    with tempfile.TemporaryDirectory() as tmp:
        built = build_runs(Path(tmp) / "runs", AutoTokenizer.from_pretrained(model), model)
        viewer = Viewer([str(built.root)], Path(tmp) / "view.log")
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(f"{viewer.url}#/run?run=demo")
                page.wait_for_selector("tr.episode-row")
                page.screenshot(path=HERE / "viewer-run.png", full_page=False)
                page.goto(f"{viewer.url}#/episode?run=demo&id={quote('t5/0', safe='')}")
                page.wait_for_selector("#tokens .tok")
                page.click("#env-log summary")  # the env log, with its state changes
                page.screenshot(path=HERE / "viewer-episode.png", full_page=True)
                live = [
                    {
                        "episode": f"t{7 + i}/{i % 2}",
                        "env": "agentrl/Calculator-v0",
                        "turn": i % 3,
                        "phase": "engine" if i % 2 else "env",
                        "started_version": 2 + i % 2,
                        "tokens_by_version": {"2": 20 + i, "3": 9},
                        "tool_calls": i % 2,
                        "age_s": 2.5 * i,
                    }
                    for i in range(4)
                ]
                (built.run / "status.json").write_text(
                    json.dumps(
                        {
                            "state": "training",
                            "pid": os.getpid(),
                            "step": 3,
                            "steps": 5,
                            "version": 3,
                            "updated_at": time.time(),
                            "episodes": live,
                        }
                    )
                )
                page.goto(f"{viewer.url}#/run?run=demo")
                page.wait_for_selector("tr.live-episode")
                page.screenshot(
                    path=HERE / "viewer-live.png",
                    clip={"x": 0, "y": 0, "width": 1280, "height": 420},
                )
                browser.close()
        finally:
            viewer.stop()


if __name__ == "__main__":
    main()

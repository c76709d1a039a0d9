"""``agentrl view`` on a big store: the episode list and one long episode over HTTP.

    python benchmarks/bench_view.py [--episodes 100000] [--long-tokens 32768] [--repeats 5]

Builds a store of ``--episodes`` finished episodes (two turns, 64 tokens each, written
with ``executemany`` in a few large transactions) plus one episode of ``--long-tokens``
tokens written with the store's own ``save_episode``, starts ``agentrl view`` on it (a
subprocess, as a user runs it), and times through its HTTP API: the first page of the
episode list (50 rows, with the total count and the filter choices), a filtered page,
a page deep in the list (offset 90%), and the long episode (the first request loads
the run's tokenizer; the others are warm); then, where Playwright and the OS's Chromium
are there, the same list and episode as the page shows them (from the navigation until
every row or every coloured token is in the page). Targets: list at most 1 s, episode at most
1 s. Prints a table; saves benchmarks/results/view.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from agentrl.store import EpisodeStore
from agentrl.store.schema import ARRAY_DTYPES, encode_array
from agentrl.types import Task, TokenSpan, Trajectory
from benchmarks.common import save, table

ROOT = Path(__file__).resolve().parents[1]
ENV = "agentrl/Calculator-v0"


def _meta(tokens: int) -> str:
    """The meta JSON of every bulk episode (a prompt, then one assistant turn)."""
    half = tokens // 2
    messages = [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4"},
    ]
    return json.dumps(
        {
            "task_id": "",
            "seed": 0,
            "messages": messages,
            "turn_rewards": [1.0],
            "spans": [["prompt", 0, half, 0], ["assistant", half, tokens, 0]],
            "reason": "",
            "failure": None,
            "timings": {},
            "info": {},
            "env_log": [],
            "turn_starts": [{"tokens": half}],
        }
    )


def _trajectory_rows(batch: range, tokens: int, now: float) -> list[tuple[Any, ...]]:
    half, meta = tokens // 2, _meta(tokens)
    mask = np.r_[np.zeros(half), np.ones(half)]
    fixed = {
        "token_ids": np.arange(tokens) % 300 + 20,
        "loss_mask": mask,
        "logprobs": np.r_[np.full(half, np.nan), np.full(half, -0.5)],
    }
    blobs = {k: encode_array(fixed[k], d) for k, d in ARRAY_DTYPES.items() if k in fixed}
    rows = []
    for i in batch:
        v = i // 1000
        versions = encode_array(np.where(mask > 0, v, -1), ARRAY_DTYPES["versions"])
        rows.append(
            (
                f"t{i}/0",
                f"t{i}",
                ENV,
                "failed" if i % 17 == 0 else "finished",
                float(i % 2),
                v,
                v + i % 3,
                tokens,
                half,
                blobs["token_ids"],
                blobs["logprobs"],
                versions,
                blobs["loss_mask"],
                meta,
                now + i,
            )
        )
    return rows


def fill(store: EpisodeStore, episodes: int, tokens: int = 64) -> None:
    """``episodes`` finished one-turn episodes (one task each), 20,000 to a transaction,
    written with ``executemany`` straight into the store's tables."""
    now = time.time()
    db = store._db
    for start in range(0, episodes, 20_000):
        batch = range(start, min(start + 20_000, episodes))
        db.execute("BEGIN")
        db.executemany(
            "INSERT INTO tasks (task_id, position, env_id, seed, env_kwargs, "
            "group_size, state) VALUES (?, ?, ?, ?, '{}', 1, 'trained')",
            [(f"t{i}", i, ENV, i) for i in batch],
        )
        db.executemany(
            "INSERT INTO episodes (episode_id, attempt, task_id, env_id, state, "
            "started_version, updated_at, reward) VALUES (?, 0, ?, ?, ?, ?, ?, ?)",
            [
                (
                    f"t{i}/0",
                    f"t{i}",
                    ENV,
                    "failed" if i % 17 == 0 else "finished",
                    i // 1000,
                    now + i,
                    float(i % 2),
                )
                for i in batch
            ],
        )
        db.executemany(
            "INSERT INTO trajectories (episode_id, attempt, segment, task_id, env_id, "
            "status, reward, min_version, max_version, num_tokens, num_sampled, "
            "token_ids, logprobs, versions, loss_mask, meta, created_at) VALUES "
            "(?, 0, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            _trajectory_rows(batch, tokens, now),
        )
        db.execute("COMMIT")


def long_episode(store: EpisodeStore, tokens: int) -> str:
    """One episode of ``tokens`` tokens over 64 turns, saved with the store's API."""
    turns, per = 64, tokens // 64
    ids = (np.arange(tokens) * 7 + 20) % 600
    mask = np.tile(np.r_[np.zeros(per // 4), np.ones(per - per // 4)], turns)
    spans = []
    for t in range(turns):
        spans += [
            TokenSpan("env", t * per, t * per + per // 4, t),
            TokenSpan("assistant", t * per + per // 4, (t + 1) * per, t),
        ]
    versions = np.where(mask > 0, np.repeat(np.arange(turns) // 8, per), -1)
    messages = [
        m
        for t in range(turns)
        for m in (
            {"role": "user", "content": f"turn {t}"},
            {"role": "assistant", "content": "x" * 200},
        )
    ]
    trajectory = Trajectory(
        episode_id="long/0",
        task_id="long",
        env_id=ENV,
        seed=0,
        token_ids=ids,
        logprobs=np.where(mask > 0, -0.3, np.nan),
        versions=versions,
        loss_mask=mask,
        spans=tuple(spans),
        messages=messages,
        turn_rewards=[0.0] * turns,
        reward=1.0,
        status="finished",
    )
    task = Task("long", ENV, 0)
    store.add_tasks([task], 1)
    store.episode_started("long/0", task, 0, 0)
    store.save_episode([trajectory])
    return "long/0"


def start_viewer(root: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = log.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentrl.cli", "view", str(root), "--no-browser"],
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = re.search(r"agentrl view: (http://\S+)", log.read_text())
        if found:
            return proc, found.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise RuntimeError(f"agentrl view did not start:\n{log.read_text()}")


def timed(url: str) -> tuple[float, Any]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as r:
        body = json.loads(r.read())
    return time.perf_counter() - started, body


def measure(base: str, long_id: str, episodes: int, repeats: int) -> dict[str, Any]:
    deep = int(0.9 * episodes)
    cases = {
        "list: first page": "episodes?run=.",
        "list: filtered (failed, reward >= 0.5)": "episodes?run=.&state=failed&min_reward=0.5",
        f"list: page at offset {deep}": f"episodes?run=.&offset={deep}",
        "episode: 32k tokens": f"episode?run=.&id={long_id}",
    }
    out: dict[str, Any] = {}
    for name, path in cases.items():
        first, body = timed(base + "api/" + path)
        warm = [timed(base + "api/" + path)[0] for _ in range(repeats)]
        size = sum(len(s["ids"]) for s in body["segments"]) if "segments" in body else body["total"]
        out[name] = {
            "first_s": first,
            "warm_median_s": statistics.median(warm),
            "warm_max_s": max(warm),
            "size": size,
        }
    return out


def in_browser(base: str, long_id: str, tokens: int, repeats: int) -> dict[str, Any]:
    """Seconds until the OS's headless Chromium shows the episode list (50 rows) and the
    long episode (every token coloured); None where Playwright or Chromium is missing."""
    try:
        from playwright.sync_api import sync_playwright

        from tests.view.conftest import CHROMIUM, CHROMIUM_ARGS
    except ImportError:
        return {}
    if not Path(CHROMIUM).exists():
        return {}
    out: dict[str, Any] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_context(bypass_csp=True).new_page()
        page.goto(base)  # the page's own files, cached for the timed loads
        for name, size, route, done in (
            (
                "page: episode list",
                50,
                "#/run?run=.",
                "document.querySelectorAll('tr.episode-row').length === 50",
            ),
            (
                "page: 32k-token episode",
                tokens,
                f"#/episode?run=.&id={long_id}",
                f"document.querySelectorAll('#tokens .tok').length === {tokens} && "
                "document.querySelector('#legend .legend-item') !== null",
            ),
        ):
            took = []
            for _ in range(repeats):
                page.goto(base + "#/")
                page.wait_for_selector("tr[data-run]")
                started = time.perf_counter()
                page.goto(base + route)
                page.wait_for_function(done, timeout=120_000, polling=20)
                took.append(time.perf_counter() - started)
            out[name] = {
                "first_s": took[0],
                "warm_median_s": statistics.median(took[1:]),
                "warm_max_s": max(took[1:]),
                "size": size,
            }
        browser.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=100_000)
    parser.add_argument("--long-tokens", type=int, default=32_768)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from agentrl.models import resolve_model

    with tempfile.TemporaryDirectory(prefix="bench-view-") as tmp:
        root = Path(tmp) / "run"
        started = time.perf_counter()
        with EpisodeStore.open(root) as store:
            store.begin_run("train", {"model": {"path": resolve_model("tiny")}})
            fill(store, args.episodes)
            long_id = long_episode(store, args.long_tokens)
        build_s = time.perf_counter() - started
        db_mb = (root / "episodes.db").stat().st_size / 2**20
        proc, url = start_viewer(root, Path(tmp) / "view.log")
        try:
            results = measure(url, long_id, args.episodes, args.repeats)
            results.update(in_browser(url, long_id, args.long_tokens, args.repeats + 1))
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(10)
    rows = [
        (
            name,
            r["size"],
            f"{r['first_s']:.3f}",
            f"{r['warm_median_s']:.3f}",
            f"{r['warm_max_s']:.3f}",
        )
        for name, r in results.items()
    ]
    markdown = (
        f"store: {args.episodes} episodes + one of {args.long_tokens} tokens, "
        f"{db_mb:.0f} MiB, built in {build_s:.1f} s\n\n"
        + table(["request", "rows / tokens", "first s", "warm median s", "warm max s"], rows)
    )
    print(markdown)
    save("view", vars(args), {"build_s": build_s, "db_mib": db_mb, **results}, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the Ray backend costs on one machine: the same small run with and without Ray.

    python benchmarks/bench_cluster.py [--steps 6]

The same `agentrl train` (the tiny model, agentrl/GuessNumber-v0, one `vllm serve`
server, the env in the orchestrator) runs twice as a subprocess: ``cluster.backend =
"local"`` (agentrl starts the server itself, ``inference.num_servers = 1``) and
``backend = "ray"`` with ``address = "local"`` (a one-machine Ray started for the run; the
server a Ray actor, reached through the relay). Reported side by side: wall time of the
whole command (startup and shutdown included), the time from the run's start to its last
step, and generated tokens per second (the mean of the per-step rows in metrics.jsonl).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import save, table  # noqa: E402

CONFIG = """
[run]
name = "bench-cluster"
[env]
id = "agentrl/GuessNumber-v0"
[rollout]
group_size = 4
concurrency = 16
max_turns = 3
max_tokens_per_turn = 8
[inference]
mode = "server"
num_servers = 1
[train]
steps = {steps}
groups_per_step = 2
[eval]
episodes = 0
[log]
progress = "plain"
plots = false
"""

WAYS = {
    "local": [],
    "ray": [
        '--cluster.backend="ray"',
        '--cluster.address="local"',
        "--cluster.inference_servers=1",
    ],
}
"""The way the run is placed: its command-line overrides."""


def run_once(way: str, steps: int, folder: Path) -> dict[str, Any]:
    config = folder / f"{way}.toml"
    config.write_text(CONFIG.format(steps=steps))
    run_dir = folder / way
    agentrl = str(Path(sys.executable).parent / "agentrl")
    args = [agentrl, "train", str(config), f'--run.out="{run_dir}"', *WAYS[way]]
    environ = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    started = time.perf_counter()
    done = subprocess.run(args, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=1800)
    wall_s = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{way}: agentrl train failed:\n{done.stdout[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps_rows = [r for r in rows if "tokens_per_s" in r]
    return {
        "wall_s": wall_s,
        "to_last_step_s": float(steps_rows[-1]["wall_s"]),
        "tokens_per_s": statistics.mean(float(r["tokens_per_s"]) for r in steps_rows),
        "steps": len(steps_rows),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="training steps per run")
    args = parser.parse_args(argv)
    results: dict[str, dict[str, Any]] = {}
    load_at_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        for way in WAYS:
            print(f"  {way}: agentrl train, {args.steps} steps ...", flush=True)
            results[way] = run_once(way, args.steps, Path(tmp))
            print(f"  {way}: {results[way]}", flush=True)
    rows = [
        [way, r["wall_s"], r["to_last_step_s"], r["tokens_per_s"], r["steps"]]
        for way, r in results.items()
    ]
    md = (
        '### The Ray backend on one machine (`cluster.address = "local"`, one `vllm serve`)\n\n'
        + table(
            [
                "backend",
                "command wall time (s)",
                "start to last step (s)",
                "tokens/s (mean of steps)",
                "steps",
            ],
            rows,
        )
    )
    print(md)
    # The machine may be shared: its load beside the figures (1-minute average, start/end).
    settings = {"steps": args.steps, "load_average_1m": [load_at_start, os.getloadavg()[0]]}
    save("cluster", settings, results, md)
    return results


if __name__ == "__main__":
    main()

"""`agentrl export` at scale: time and peak memory of exporting 10,000 and 100,000 episodes.

    python benchmarks/bench_export.py [--episodes 100000] [--small 10000]
                                      [--formats jsonl,atif,inspect]

Builds a store of ``--episodes`` ended episodes through the store's own API (each the
shape of a Calculator demo episode: a 180-token prompt, a tool call, its result, an
answer; 230 tokens, two policy versions), then exports the first ``--small`` and all of
them in each format, each export in a fresh process (``agentrl export``'s own code path,
:func:`agentrl.export.export_run`), and reports seconds, episodes per second and the
process's peak RSS. Constant memory shows as the same peak at both sizes; what grows
is named in the table's notes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl.export.inspect_format import SAMPLES_PER_LOG
from agentrl.store import EpisodeStore
from agentrl.types import Task, TokenSpan, Trajectory
from benchmarks.common import save, table

BATCH = 2000
PROMPT, CALL, RESULT, ANSWER = 180, 24, 16, 10


def episode(i: int) -> Trajectory:
    """One ended episode shaped like the Calculator demo's (tool call, result, answer)."""
    n = PROMPT + CALL + RESULT + ANSWER
    ids = [(i * 7 + k) % 500 + 1 for k in range(n)]
    sampled = [(PROMPT, PROMPT + CALL, 0), (PROMPT + CALL + RESULT, n, 1)]
    logprobs, versions, mask = [math.nan] * n, [-1] * n, [0] * n
    for start, end, version in sampled:
        for k in range(start, end):
            logprobs[k], versions[k], mask[k] = -0.25, version, 1
    spans = (
        TokenSpan("prompt", 0, PROMPT, 0),
        TokenSpan("assistant", PROMPT, PROMPT + CALL, 0),
        TokenSpan("tool", PROMPT + CALL, PROMPT + CALL + RESULT, 1),
        TokenSpan("assistant", PROMPT + CALL + RESULT, n, 1),
    )
    a, b = i % 997, i % 991
    call = {"name": "calculator", "arguments": {"expression": f"{a}+{b}"}}
    messages = [
        {"role": "system", "content": "Use the calculator tool, then reply with 'Answer: N'."},
        {"role": "user", "content": f"What is {a} + {b}?"},
        {"role": "assistant", "content": f"<tool_call>{json.dumps(call)}</tool_call>"},
        {"role": "tool", "name": "calculator", "content": str(a + b)},
        {"role": "assistant", "content": f"Answer: {a + b}"},
    ]
    env_log = [
        {"obs": messages[1:2]},
        {"tool": "calculator", **call, "result": str(a + b)},
        {"action": messages[-1]["content"], "reward": 1.0, "terminated": True},
    ]
    return Trajectory(
        episode_id=f"t{i}/0",
        task_id=f"t{i}",
        env_id="agentrl/Calculator-v0",
        seed=i,
        token_ids=ids,
        logprobs=logprobs,
        versions=versions,
        loss_mask=mask,
        spans=spans,
        messages=messages,
        turn_rewards=[0.0, 1.0],
        reward=1.0,
        status="finished",
        reason="env terminated",
        env_log=env_log,
    )


def build_store(run_dir: Path, episodes: int) -> float:
    """Write ``episodes`` ended episodes in batches; return the seconds it took."""
    started = time.perf_counter()
    with EpisodeStore.open(run_dir) as store:
        store.begin_run("rollout", {"run": {"name": "bench-export"}, "model": {"path": "tiny"}})
        for first in range(0, episodes, BATCH):
            batch = [episode(i) for i in range(first, min(first + BATCH, episodes))]
            tasks = [Task(t.task_id, t.env_id, i) for i, t in enumerate(batch, first)]
            with store.batch():
                store.add_tasks(tasks, 1)
                store.episodes_started(
                    [(t.episode_id, task, 0, 0) for t, task in zip(batch, tasks, strict=True)]
                )
                store.save_episodes([([t], False) for t in batch])
    return time.perf_counter() - started


def child(run_dir: str, fmt: str, out: str, limit: int) -> None:
    """One export in this process; print its figures as JSON."""
    from agentrl.export import export_run

    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if fmt != "jsonl":  # the format's package, imported before the baseline is read
        __import__("atif" if fmt == "atif" else "inspect_ai.log")
        baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with EpisodeStore.open(run_dir, create=False) as store:
        result = asyncio.run(export_run(store, fmt, out, limit=limit))  # type: ignore[arg-type]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "episodes": result.episodes,
                "seconds": result.seconds,
                "peak_rss_mib": peak / 1024,
                "import_rss_mib": baseline / 1024,
                "bytes": _size(result.path),
            }
        )
    )


def _size(path: Path) -> int:
    """Bytes of the export: a file, or inspect's folder of logs."""
    return sum(p.stat().st_size for p in path.iterdir()) if path.is_dir() else path.stat().st_size


def measure(run_dir: Path, scratch: Path, fmt: str, limit: int) -> dict:
    out = scratch / (f"out-{limit}" if fmt == "inspect" else f"out-{limit}.{fmt}")
    proc = subprocess.run(
        [sys.executable, __file__, "--child", str(run_dir), fmt, str(out), str(limit)],
        capture_output=True,
        text=True,
        check=True,
    )
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    if out.is_dir():
        shutil.rmtree(out)
    else:
        out.unlink()
    row["per_s"] = row["episodes"] / row["seconds"]
    print(
        f"  {fmt} x {limit}: {row['seconds']:.1f} s, {row['per_s']:.0f} episodes/s, peak RSS "
        f"{row['peak_rss_mib']:.0f} MiB",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=100_000)
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--formats", default="jsonl,atif,inspect")
    parser.add_argument(
        "--inspect-episodes",
        type=int,
        default=100_000,
        help="the larger size for inspect (its writer is the slowest)",
    )
    parser.add_argument("--child", nargs=4, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child[:3], int(args.child[3]))
        return {}
    formats = args.formats.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-export-") as tmp:
        scratch = Path(tmp)
        built = build_store(scratch / "run", args.episodes)
        size = (scratch / "run" / "episodes.db").stat().st_size
        print(
            f"  store: {args.episodes} episodes in {built:.0f} s, {size / 2**20:.0f} MiB",
            flush=True,
        )
        rows = {}
        for f in formats:
            big = min(args.episodes, args.inspect_episodes if f == "inspect" else args.episodes)
            rows[f] = {n: measure(scratch / "run", scratch, f, n) for n in (args.small, big)}
    md = _markdown(rows, args, built)
    print(md, flush=True)
    rows = {f: {str(n): r for n, r in by_size.items()} for f, by_size in rows.items()}
    result = {"store_build_s": built, "store_mib": size / 2**20, "exports": rows}
    save("export", {k: v for k, v in vars(args).items() if k != "child"}, result, md)
    return result


def _markdown(rows: dict, args: argparse.Namespace, built: float) -> str:
    lines = []
    for f, by_size in rows.items():
        (small, a), (big, b) = sorted(by_size.items())
        lines.append(
            [
                f,
                f"{big:,}",
                b["seconds"],
                b["per_s"],
                f"{a['peak_rss_mib']:.0f} at {small:,}",
                f"{b['peak_rss_mib']:.0f} at {big:,}",
                b["import_rss_mib"],
                b["bytes"] / 2**20,
            ]
        )
    body = table(
        [
            "format",
            "episodes",
            "seconds",
            "episodes/s",
            "peak RSS (MiB)",
            "peak RSS (MiB)",
            "after imports (MiB)",
            "file (MiB)",
        ],
        lines,
    )
    return (
        "### Export (`agentrl export`), Calculator-shaped episodes of 230 tokens\n\n"
        + body
        + f"\n\nEach export in a fresh process, from a store of {args.episodes:,} episodes "
        f"built in {built:.0f} s through the store's API. Episodes stream from the store a "
        "page (500) at a time; `inspect` writes a folder of `.eval` logs of "
        f"{SAMPLES_PER_LOG:,} samples each, so it holds at most one log's samples."
    )


if __name__ == "__main__":
    main()

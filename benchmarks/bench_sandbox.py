"""The sandbox's cost per call: start-to-result of a trivial program, per mechanism.

    python benchmarks/bench_sandbox.py [--calls 40] [--concurrent 32] [--rounds 3]

Latency: ``print(1)`` through :func:`agentrl.sandbox.run_python` (the ``python`` tool's
path, audit hook on, default limits), one call at a time, the mechanisms interleaved
call by call so a noisy machine moves all of them; p50 and p99 of ``--calls`` each.
Throughput: ``--concurrent`` calls in flight at once (as that many episodes calling the
tool would be), ``--rounds`` times that many calls per mechanism, again interleaved by
round; calls per second, and p50/p99 start-to-result under that load. A mechanism this
machine cannot run is listed with the probe's reason. ``process`` (a plain child
process, no OS isolation) is the cost of the tool before OS isolation.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl.sandbox import MECHANISMS, SandboxLimits, SandboxPolicy, probe, run_python
from benchmarks.common import quantile, save, table

PROGRAM = "print(1)"
LIMITS = SandboxLimits()


async def one_call(mechanism: str) -> float:
    """Seconds from the call to its result; the run must have printed 1."""
    policy = SandboxPolicy(isolation=mechanism)  # type: ignore[arg-type]
    started = time.perf_counter()
    result = await run_python(PROGRAM, LIMITS, policy)
    took = time.perf_counter() - started
    if (result.returncode, result.output) != (0, "1\n"):
        raise RuntimeError(f"{mechanism}: print(1) gave {result!r}")
    return took


async def concurrent_round(mechanism: str, concurrent: int) -> tuple[float, list[float]]:
    """Wall seconds for ``concurrent`` calls at once, and each call's latency."""
    started = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(one_call(mechanism)) for _ in range(concurrent)]
    return time.perf_counter() - started, [t.result() for t in tasks]


async def measure(mechanisms: list[str], args: argparse.Namespace) -> dict[str, dict]:
    for mechanism in mechanisms:  # warm-up: the probe, imports, page cache
        await one_call(mechanism)
    serial: dict[str, list[float]] = {m: [] for m in mechanisms}
    for _ in range(args.calls):
        for mechanism in mechanisms:
            serial[mechanism].append(await one_call(mechanism))
    walls: dict[str, float] = dict.fromkeys(mechanisms, 0.0)
    loaded: dict[str, list[float]] = {m: [] for m in mechanisms}
    for _ in range(args.rounds):
        for mechanism in mechanisms:
            wall, latencies = await concurrent_round(mechanism, args.concurrent)
            walls[mechanism] += wall
            loaded[mechanism] += latencies
    rows = {}
    for m in mechanisms:
        rows[m] = {
            "p50_ms": 1000 * statistics.median(serial[m]),
            "p99_ms": 1000 * quantile(serial[m], 0.99),
            "calls_per_s": args.rounds * args.concurrent / walls[m],
            "loaded_p50_ms": 1000 * statistics.median(loaded[m]),
            "loaded_p99_ms": 1000 * quantile(loaded[m], 0.99),
        }
        print(
            f"  {m}: p50 {rows[m]['p50_ms']:.0f} ms, p99 {rows[m]['p99_ms']:.0f} ms, "
            f"{rows[m]['calls_per_s']:.1f} calls/s at {args.concurrent} at once",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=40, help="serial calls per mechanism")
    parser.add_argument("--concurrent", type=int, default=32, help="calls in flight at once")
    parser.add_argument("--rounds", type=int, default=3, help="concurrent rounds per mechanism")
    args = parser.parse_args(argv)
    unavailable = {m: probe(m) for m in MECHANISMS if probe(m) is not None}
    mechanisms = [m for m in MECHANISMS if m not in unavailable]
    print(
        f"sandbox cost: {mechanisms} ({args.calls} serial calls each, "
        f"{args.rounds} x {args.concurrent} concurrent)",
        flush=True,
    )
    rows = asyncio.run(measure(mechanisms, args))
    md = "### Sandbox cost per call (`print(1)` through the python tool's sandbox)\n\n" + table(
        [
            "mechanism",
            "p50 (ms)",
            "p99 (ms)",
            f"calls/s at {args.concurrent} at once",
            f"p50 at {args.concurrent} (ms)",
            f"p99 at {args.concurrent} (ms)",
        ],
        [
            [m, r["p50_ms"], r["p99_ms"], r["calls_per_s"], r["loaded_p50_ms"], r["loaded_p99_ms"]]
            for m, r in rows.items()
        ]
        + [[m, "n/a", "n/a", "n/a", "n/a", why] for m, why in unavailable.items()],
    )
    md += (
        f"\n\nOne call at a time: {args.calls} per mechanism, interleaved. `process` has no "
        "OS isolation: the tool's cost before it (plus the seccomp filter)."
    )
    print(md, flush=True)
    result = {"mechanisms": rows, "unavailable": unavailable}
    save("sandbox", vars(args), result, md)
    return result


if __name__ == "__main__":
    main()

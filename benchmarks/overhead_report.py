"""The overhead benchmark's table and notes, from its result (``results/overhead.json``).

``benchmarks/bench_overhead.py`` measures; this module says what was measured: one row
a path (raw vLLM, the platform, each diagnostic asked for), what the diagnostic rows
mean, and whether the ratio target was met.
"""

from __future__ import annotations

import argparse
import statistics

from benchmarks.common import table


def median_gaps(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Each request-gap figure's median over the rounds."""
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


def _gap_cells(g: dict[str, float]) -> list[str]:
    return [f"{g['gap_p50_ms']:.2f} / {g['gap_p90_ms']:.2f}", f"{g['first_request_ms']:.1f}"]


def _raw_row(label: str, c: dict) -> list:
    """A table row for one of raw vLLM's diagnostic rounds (no engine-step count)."""
    return [
        label,
        c["tokens_per_s"],
        c["ratio"],
        _interval(c["paired_ratio"]),
        c["cpu_ms_per_round"],
        "",
        *_gap_cells(c["request_gaps"]),
    ]


def _interval(r: dict[str, float]) -> str:
    return f"{r['median']:.3f} ({r['low']:.3f}-{r['high']:.3f})"


def _verdict(r: dict[str, float], target: float) -> str:
    """What the one loop's paired interval says of the target."""
    if r["rounds"] < 5:  # a bootstrap over so few rounds says nothing
        return f"{r['rounds']} rounds are too few for an interval: run --rounds 11 or more"
    if r["low"] >= target:
        return f"its 95% interval is above {target}: met"
    if r["high"] < target:
        return f"its 95% interval is below {target}: not met"
    return f"its 95% interval spans {target}: these rounds cannot tell"


def report_rows(result: dict) -> list[list]:
    """The table's rows: raw, the platform, then each diagnostic asked for."""
    rows = [
        [
            "raw AsyncLLM",
            result["raw_tokens_per_s"],
            1.0,
            "",
            result["raw_cpu_ms_per_round"],
            result["raw_engine_steps_per_round"],
            *_gap_cells(result["raw_request_gaps"]),
        ],
        [
            "agentrl episode loop + store",
            result["platform_tokens_per_s"],
            result["ratio"],
            _interval(result["paired_ratio"]),
            result["platform_cpu_ms_per_round"],
            result["platform_engine_steps_per_round"],
            *_gap_cells(result["platform_request_gaps"]),
        ],
    ]
    if (w := result["without_store"]) is not None:
        rows.append(
            [
                "agentrl episode loop, no store (diagnostic)",
                w["tokens_per_s"],
                w["ratio"],
                _interval(w["paired_ratio"]),
                w["cpu_ms_per_round"],
                w["engine_steps_per_round"],
                *_gap_cells(w["request_gaps"]),
            ]
        )
    for k, w in result["workers"].items():
        rows.append(
            [
                f"agentrl, {k} rollout worker processes + store",
                w["tokens_per_s"],
                w["ratio"],
                _interval(w["paired_ratio"]),
                w["main_cpu_ms_per_round"],
                w["engine_steps_per_round"],
                *_gap_cells(w["request_gaps"]),
            ]
        )
    if (e := result["every_core"]) is not None:
        rows.append(_raw_row("raw AsyncLLM, this process on every core (diagnostic)", e["raw"]))
        rows.append(
            _raw_row(
                "agentrl episode loop + store, this process on every core, "
                "against raw on every core (diagnostic)",
                e["platform"],
            )
        )
    for c in result["calibration"]:
        where = "in a thread" if c["in_thread"] else "on the event loop"
        rows.append(
            _raw_row(f"raw AsyncLLM + {c['burn_us']:g} us of CPU a turn {where} (calibration)", c)
        )
    for c in result["spread_start"]:
        rows.append(
            _raw_row(
                f"raw AsyncLLM, first requests spread over {c['spread_ms']:g} ms (calibration)", c
            )
        )
    for c in result["idle_gap"]:
        rows.append(
            _raw_row(
                f"raw AsyncLLM, {c['gap_ms']:g} ms idle before each next turn (calibration)", c
            )
        )
    if (c := result["replay_timing"]) is not None:
        rows.append(
            _raw_row("raw AsyncLLM replaying the platform's request timing, idle (calibration)", c)
        )
    return rows


def report(args: argparse.Namespace, result: dict) -> str:
    """The Markdown the benchmark prints and saves: the table and what it means."""
    at_once = f"{args.concurrency} at a time" if args.concurrency else ""
    rows = report_rows(result)
    shape = f"{args.episodes} episodes, {at_once or 'all at once'}"
    md = (
        "### Platform overhead against raw vLLM (same tokens, same concurrency)\n\n"
        f"{shape}; {args.turns} turns of {args.tokens} tokens each.\n\n"
    ) + table(
        [
            "path",
            "tokens/s (median)",
            "ratio",
            "paired ratio (95% interval)",
            "this process's CPU ms a round (median)",
            "engine steps a round (median)",
            "next request after a turn, ms (p50 / p90)",
            "first request of an episode, ms",
        ],
        rows,
    )
    turns = args.episodes * args.turns
    extra = (result["platform_cpu_ms_per_round"] - result["raw_cpu_ms_per_round"]) / turns
    md += (
        f"\n\nThe episode loop's CPU beyond raw vLLM's client: {extra * 1000:,.0f} us a turn "
        f"({turns} turns a round), in the process the engine's client runs in."
    )
    md += (
        "\n\nRequest gaps: how long after a turn's last output reached the client the "
        "episode's next request reached the engine (p50 and p90 over a round's turns), and "
        "how long after the round began each episode's first request did (median over its "
        "episodes); each the median over the rounds. Time between a turn and the next request "
        "is time the engine could have been stepping that sequence."
    )
    where = result["placement"]
    md += (
        f"\n\nThis process ran on core(s) {where['this_process_cores']}; vLLM's CPU worker "
        f"is bound to {where['vllm_worker_cores'] or 'no core of its own'} "
        "(`inference.keep_off_worker_cores`)."
    )
    md += _diagnostic_notes(result)
    best = max([result["ratio"], *(w["ratio"] for w in result["workers"].values())])
    md += (
        f"\n\nTarget: ratio >= 0.95. One loop: {'met' if result['ratio'] >= 0.95 else 'NOT met'}"
        f"; best: {best:.3f}. The paired ratio is the median of each round's platform "
        f"figure over that round's raw one; "
        f"{_verdict(result['paired_ratio'], 0.95)}."
    )
    return md


def _diagnostic_notes(result: dict) -> str:
    """What each kind of diagnostic row in the table means (those present)."""
    md = ""
    if result["every_core"] is not None:
        md += (
            "\n\nEvery-core rows: raw vLLM's and the platform's rounds with every thread "
            "of this process allowed on every core, the worker's too (as before agentrl kept "
            "off it); raw's row is against raw's own rounds, the platform's against raw's on "
            "every core."
        )
    if result["spread_start"]:
        md += (
            "\n\nSpread rows: raw vLLM's own rounds, the episodes' first requests going out "
            "evenly over that many milliseconds from the round's start (the platform's go "
            "out as their episodes start: admission, env build, reset, first rendering). "
            "They tell what a slow start by itself costs the engine on this machine."
        )
    if result["idle_gap"]:
        md += (
            "\n\nIdle-gap rows: raw vLLM's own rounds, each episode waiting that many "
            "milliseconds, idle (no CPU), between a turn's end and its next request. Beside "
            "the platform's gap p50 they tell how much of its overhead that wait alone "
            "explains on this machine."
        )
    if result["calibration"]:
        md += (
            "\n\nCalibration rows: raw vLLM's own rounds, each turn spending that much "
            "Python CPU before its request (on the loop: the request waits for it) or in a "
            "thread beside the loop (as the platform's store writer and render thread do). "
            "They tell what any client-side CPU a turn costs the engine on this machine."
        )
    return md

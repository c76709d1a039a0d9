"""Platform overhead against raw vLLM: the same token workload both ways.

    python benchmarks/bench_overhead.py [--episodes 64] [--turns 3] [--tokens 32] [--workers 2]
                                        [--concurrency C] [--rounds 11] [--without-store]
                                        [--calibrate US[,US]]
                                        [--spread-start MS[,MS]] [--idle-gap MS[,MS]]
                                        [--replay-timing] [--every-core]

Raw: ``AsyncLLM.generate`` directly (the engine's own object), E concurrent
"episodes", each T turns of exactly L sampled tokens (``ignore_eos``); after each turn
the same reply tokens the platform would append are appended, and the next turn is
generated from the grown prefix. By default every episode starts at once (a round is one
wave); with ``--concurrency C`` at most C run at a time, the next starting as one ends,
which is how a run keeps its slots full (then the episodes' turns no longer end in the
same engine step, and a wait between turns costs what it costs a run; an episode's first
request then also counts its wait for a slot).

Platform: the full episode loop on the same engine: Scheduler, EpisodeRunner (chat
template, tool-call parsing, env step in the loop, token provenance), a zero-cost
env (``bench/Echo-v0``), and the episode store writer (checkpoints as
``rollout.checkpoint_interval_s`` takes them: at an episode's first turn boundary, then
once a second; every trajectory written).

Platform without the store (``--without-store``, a diagnostic): the same loop with no
checkpoints and no store writer, to tell the store's share of the overhead from the
loop's. It is not the product's path and does not count toward the target.

Calibration (``--calibrate US``, a diagnostic): raw vLLM's rounds again, each turn
spending US microseconds of Python CPU before its request, once on the event loop (the
request waits for it) and once in a thread beside the loop (as the platform's store
writer and render thread work). On a machine where the engine's processes use every
core, they tell what any client-side CPU a turn costs the engine, whoever spends it: the
budget of CPU a turn a ratio target leaves the platform.

Spread start (``--spread-start MS``, a diagnostic): raw vLLM's rounds again, the
episodes' first requests going out evenly over MS milliseconds from the round's start,
as the platform's go out when each episode has started (admission, env build, reset,
first rendering): what a slow start by itself costs the engine. Every path's table row
also gives its request gaps (:class:`RequestTimes`).

Idle gap (``--idle-gap MS``, a diagnostic): raw vLLM's rounds again, each episode
waiting MS milliseconds (an idle ``asyncio.sleep``, no CPU) between a turn's end and its
next request: what the platform's gap between turns (its p50 is in the table) would cost
by itself, without any of its CPU. Where raw with the platform's gap loses about what
the platform loses, the overhead is that wait, not the CPU spent in it.

Replayed timing (``--replay-timing``, a diagnostic): raw vLLM's rounds again, each
request sent when the platform's round just before sent its own (episodes matched in
the order of their first requests: each first request as long after the round's start,
each next one as long after its turn's end; :meth:`RequestTimes.timing`), waiting idle
in between: what the platform's request timing costs the engine, apart from its CPU.
Where raw with the platform's timing loses about what the platform loses, the overhead
is when the requests go out; the rest is the CPU the platform spends beside the engine.

Every core (``--every-core``, a diagnostic): raw vLLM's and the platform's rounds again
with every thread of this process allowed on every core, as before agentrl kept it off
the cores vLLM's CPU worker bound itself to (``inference.keep_off_worker_cores``,
:mod:`agentrl.runtime.cores`); the platform's row is paired against raw's rounds on every core.
What keeping off the worker's cores buys each of them, side by side.

Platform through rollout workers: the same, the episodes in ``--workers`` worker
processes (:mod:`agentrl.rollout.workers`) against the same engine in this process.

They alternate ``--rounds`` times after a warm-up; the table gives the median tokens/s
of each and the ratio (target: at least 0.95), the paired ratio (the median of each
round's figure over that round's raw one) with its 95% bootstrap interval over the
rounds (where it spans 0.95, the rounds cannot tell which side the ratio is on), the
CPU time this process (the one running the engine's client, and the platform's loop,
render thread and store writer) spent in a round, each way, and the engine steps a
round took. The steps tell the two
kinds of overhead apart: a platform slow to hand the engine its next requests leaves
it stepping smaller batches, so the same tokens take more steps; the same number of
steps at a lower tokens/s means each step took longer, the engine's processes getting
less CPU (on a machine with few cores the platform's own CPU competes with them).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl.runtime import cores
from benchmarks.common import paired_ratio, save
from benchmarks.overhead_paths import (
    RequestTimes,
    count_engine_steps,
    platform_round,
    raw_round,
    start_workers,
)
from benchmarks.overhead_report import median_gaps, report


class Figures:
    """Every path's figures, a value a round, by path key (also its request-gap key)."""

    def __init__(self) -> None:
        self.tps: dict[str, list[float]] = collections.defaultdict(list)
        self.cpu: dict[str, list[float]] = collections.defaultdict(list)
        self.steps: dict[str, list[int]] = collections.defaultdict(list)
        self.gaps: dict[str, list[dict[str, float]]] = collections.defaultdict(list)

    def add(self, key: str, sampled: int, wall: float, cpu: float, gaps: dict[str, float]) -> None:
        self.tps[key].append(sampled / wall)
        self.cpu[key].append(cpu)
        self.gaps[key].append(gaps)

    def path(self, key: str, cpu_key: str = "cpu_ms_per_round") -> dict:
        """One path's figures against raw's rounds."""
        tps, raw = self.tps[key], self.tps["raw"]
        return {
            "tokens_per_s": statistics.median(tps),
            "ratio": statistics.median(tps) / statistics.median(raw),
            "paired_ratio": paired_ratio(tps, raw),
            "rounds": tps,
            cpu_key: statistics.median(self.cpu[key]) * 1000,
            "request_gaps": median_gaps(self.gaps[key]),
        }

    def stepped(self, key: str) -> dict:
        """``path(key)`` with the engine steps a round took (paths that count them)."""
        cpu_key = "main_cpu_ms_per_round" if key.endswith(" workers") else "cpu_ms_per_round"
        return {
            **self.path(key, cpu_key),
            "engine_steps_per_round": statistics.median(self.steps[key]),
        }


def _raw_variants(args: argparse.Namespace) -> list[tuple[str, str, dict[str, Any]]]:
    """Raw's diagnostic rounds: (path key, label in the round's line, raw_round keywords)."""
    return [
        *(
            (f"spread {ms:g}", f"raw spread {ms:g} ms", {"spread_s": ms / 1000})
            for ms in args.spread_start
        ),
        *((f"idle {ms:g}", f"raw idle {ms:g} ms", {"gap_s": ms / 1000}) for ms in args.idle_gap),
        *(
            (
                f"raw+{us:g}us {thread}",
                f"raw+{us:g}us {'thread' if thread else 'loop'}",
                {"burn_us": us, "in_thread": thread},
            )
            for us in args.calibrate
            for thread in (False, True)
        ),
    ]


class Bench:
    """The rounds of one benchmark run on one started engine: each path in turn."""

    def __init__(
        self,
        client,
        tokenizer,
        args: argparse.Namespace,
        prompts: list[list[int]],
        reply: list[int],
        tmp: Path,
        pools: dict,
    ) -> None:
        self.client, self.tokenizer, self.args = client, tokenizer, args
        self.prompts, self.reply, self.tmp, self.pools = prompts, reply, tmp, pools
        self.stepped = count_engine_steps(client)
        self.timer = RequestTimes(client._engine)
        self.figures = Figures()

    def _raw(self, **kwargs):
        a = self.args
        return raw_round(
            self.client, self.prompts, self.reply, a.turns, a.tokens, timer=self.timer, **kwargs
        )

    def _platform(self, folder: str, workers=None, **kwargs):
        a = self.args
        return platform_round(
            self.client,
            self.tokenizer,
            a.episodes,
            a.turns,
            a.tokens,
            0,
            self.tmp / folder,
            workers,
            timer=self.timer,
            **kwargs,
        )

    async def _measure(self, key: str, round_, *, count_steps: bool = False) -> int:
        """Run one path's round; record its figures under ``key``; the tokens sampled."""
        s0 = self.stepped[0]
        sampled, wall, cpu = await round_
        self.figures.add(key, sampled, wall, cpu, self.timer.summary())
        if count_steps:
            self.figures.steps[key].append(self.stepped[0] - s0)
        return sampled

    async def warm_up(self) -> None:
        a, tmp = self.args, self.tmp
        await raw_round(self.client, self.prompts[:8], self.reply, a.turns, a.tokens)
        await platform_round(self.client, self.tokenizer, 8, a.turns, a.tokens, 0, tmp / "w")
        if a.without_store:
            await platform_round(
                self.client, self.tokenizer, 8, a.turns, a.tokens, 0, tmp / "unused", store=False
            )
        for n, pool in self.pools.items():
            await platform_round(
                self.client, self.tokenizer, 8, a.turns, a.tokens, 0, tmp / f"w{n}", pool
            )

    async def round(self, r: int) -> str:
        """One round of every path asked for; the round's line."""
        a, f, slots = self.args, self.figures, self.args.concurrency
        n = await self._measure("raw", self._raw(slots=slots), count_steps=True)
        n2 = await self._measure("platform", self._platform(f"r{r}", slots=slots), count_steps=True)
        platform_timing = self.timer.timing()
        assert n == n2 == a.episodes * a.turns * a.tokens, (n, n2)
        raw_tps, platform_tps = f.tps["raw"][-1], f.tps["platform"][-1]
        line = f"  round {r + 1}: raw {raw_tps:,.0f} tok/s, platform {platform_tps:,.0f}"
        if a.without_store:
            n3 = await self._measure(
                "without store",
                self._platform("unused", store=False, slots=slots),
                count_steps=True,
            )
            assert n3 == n, (n, n3)
            line += f", without the store {f.tps['without store'][-1]:,.0f}"
        for k, pool in self.pools.items():
            n3 = await self._measure(
                f"{k} workers", self._platform(f"r{r}w{k}", pool, slots=slots), count_steps=True
            )
            assert n3 == n, (n, n3)
            line += f", {k} workers {f.tps[f'{k} workers'][-1]:,.0f}"
        if a.every_core:
            line += await self._every_core(r, n)
        for key, label, kwargs in _raw_variants(a):
            await self._measure(key, self._raw(slots=slots, **kwargs))
            line += f", {label} {f.tps[key][-1]:,.0f}"
        if a.replay_timing:
            await self._measure("replay timing", self._raw(timing=platform_timing))
            line += f", raw replaying the platform's timing {f.tps['replay timing'][-1]:,.0f}"
        return line

    async def _every_core(self, r: int, n: int) -> str:
        """Raw's and the platform's rounds with this process on every core."""
        slots, line = self.args.concurrency, ""
        with cores.suspended():
            for key in ("raw", "platform"):
                if key == "raw":
                    round_ = self._raw(slots=slots)
                else:
                    round_ = self._platform(f"r{r}e", slots=slots)
                n3 = await self._measure(f"every core {key}", round_)
                assert n3 == n, (n, n3)
                line += f", {key} on every core {self.figures.tps[f'every core {key}'][-1]:,.0f}"
        return line


def workload(tokenizer, args: argparse.Namespace) -> tuple[list[list[int]], list[int]]:
    """The exact prompt tokens and per-turn reply tokens the platform produces."""
    from agentrl.chat import Conversation

    prompts = []
    for i in range(args.episodes):
        text = f"Say anything, {args.turns} times (task {i})."
        conv = Conversation(tokenizer, [{"role": "user", "content": text}])
        prompts.append(list(conv.token_ids))
    conv = Conversation(tokenizer, [{"role": "user", "content": "x"}])
    conv.add_sampled([5, 6, tokenizer.convert_tokens_to_ids("<|im_end|>")], [0.0] * 3, [0] * 3)
    conv.end_assistant_turn("..", "stop")
    reply, _ = conv.delta_for([{"role": "user", "content": "ok"}])
    return prompts, reply


async def main_async(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    from agentrl.inference import InferenceConfig, VLLMEngineClient
    from agentrl.models import resolve_model
    from agentrl.runtime.metrics import tune_gc

    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts, reply = workload(tokenizer, args)
    config = InferenceConfig(max_model_len=1024, max_num_seqs=256)
    with tempfile.TemporaryDirectory() as tmp:
        async with await VLLMEngineClient.start(path, config) as client:
            placement = {
                "this_process_cores": sorted(os.sched_getaffinity(0)),
                "vllm_worker_cores": sorted(cores.worker_cores()),
            }
            pools = {}
            for n in args.workers:  # started once (imports, tokenizer), used every round
                pools[n] = await start_workers(client, tokenizer, args, n)
            bench = Bench(client, tokenizer, args, prompts, reply, Path(tmp), pools)
            try:
                tune_gc()  # as agentrl train and agentrl rollout do once started
                await bench.warm_up()
                for r in range(args.rounds):
                    print(await bench.round(r) + " tok/s", flush=True)
            finally:
                for pool in pools.values():
                    await pool.close()
    return summarize(args, bench.figures, placement)


def summarize(args: argparse.Namespace, f: Figures, placement: dict) -> dict:
    """The result file's figures (``results/overhead.json``)."""
    raw, plat = f.tps["raw"], f.tps["platform"]
    raw_m, plat_m = statistics.median(raw), statistics.median(plat)
    every_raw, every_plat = f.tps["every core raw"], f.tps["every core platform"]
    return {
        "raw_tokens_per_s": raw_m,
        "platform_tokens_per_s": plat_m,
        "ratio": plat_m / raw_m,
        "paired_ratio": paired_ratio(plat, raw),
        "raw_rounds": raw,
        "platform_rounds": plat,
        "raw_cpu_ms_per_round": statistics.median(f.cpu["raw"]) * 1000,
        "platform_cpu_ms_per_round": statistics.median(f.cpu["platform"]) * 1000,
        "raw_engine_steps_per_round": statistics.median(f.steps["raw"]),
        "platform_engine_steps_per_round": statistics.median(f.steps["platform"]),
        "raw_request_gaps": median_gaps(f.gaps["raw"]),
        "platform_request_gaps": median_gaps(f.gaps["platform"]),
        "workers": {str(k): f.stepped(f"{k} workers") for k in args.workers},
        "without_store": f.stepped("without store") if args.without_store else None,
        "calibration": [
            {"burn_us": us, "in_thread": thread, **f.path(f"raw+{us:g}us {thread}")}
            for us in args.calibrate
            for thread in (False, True)
        ],
        "spread_start": [{"spread_ms": ms, **f.path(f"spread {ms:g}")} for ms in args.spread_start],
        "idle_gap": [{"gap_ms": ms, **f.path(f"idle {ms:g}")} for ms in args.idle_gap],
        "replay_timing": f.path("replay timing") if args.replay_timing else None,
        "placement": placement,
        "every_core": {
            "raw": f.path("every core raw"),
            # the platform against raw's rounds on every core (the overhead without
            # keeping off the worker's cores)
            "platform": {
                **f.path("every core platform"),
                "ratio": statistics.median(every_plat) / statistics.median(every_raw),
                "paired_ratio": paired_ratio(every_plat, every_raw),
            },
        }
        if args.every_core
        else None,
        "tokens_per_round": args.episodes * args.turns * args.tokens,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        metavar="C",
        help="run at most C episodes at once, the next starting as one ends "
        "(a run's steady state); default: all of them at once",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--workers",
        default="2",
        help="also run the platform through this many rollout worker "
        "processes (comma-separated; '' for none)",
    )
    _add_diagnostics(parser)
    args = parser.parse_args(argv)
    if args.concurrency is not None and not 1 <= args.concurrency <= args.episodes:
        parser.error(
            f"--concurrency takes 1 to --episodes ({args.episodes}), got {args.concurrency}"
        )
    if args.replay_timing and args.concurrency is not None:
        parser.error("--replay-timing replays every episode at once; leave out --concurrency")
    args.workers = [int(w) for w in str(args.workers).split(",") if w.strip()]
    for option, unit in (
        ("calibrate", "microseconds"),
        ("spread_start", "milliseconds"),
        ("idle_gap", "milliseconds"),
    ):
        values = [float(v) for v in str(getattr(args, option)).split(",") if v.strip()]
        if any(v <= 0 for v in values):
            parser.error(f"--{option.replace('_', '-')} takes {unit} above 0, got {values}")
        setattr(args, option, values)
    return args


def _add_diagnostics(parser: argparse.ArgumentParser) -> None:
    """The diagnostic paths: raw vLLM calibrated, on every core, without the store."""
    parser.add_argument(
        "--calibrate",
        default="",
        metavar="US[,US]",
        help="also run raw vLLM with this many microseconds of CPU a turn, "
        "on the loop and in a thread: what client CPU costs the engine "
        "here",
    )
    parser.add_argument(
        "--spread-start",
        default="",
        metavar="MS[,MS]",
        help="also run raw vLLM with its episodes' first requests spread "
        "evenly over this many milliseconds: what a slow episode start "
        "costs the engine here",
    )
    parser.add_argument(
        "--idle-gap",
        default="",
        metavar="MS[,MS]",
        help="also run raw vLLM with each episode waiting this many "
        "milliseconds, idle, before each next turn: what the platform's "
        "gap between turns costs the engine here, without its CPU",
    )
    parser.add_argument(
        "--replay-timing",
        action="store_true",
        help="also run raw vLLM sending each request when the platform's "
        "round before it did (each episode's first request after the "
        "round's start, each next one after its turn's end), idle: what "
        "the platform's request timing costs the engine, without its "
        "CPU",
    )
    parser.add_argument(
        "--every-core",
        action="store_true",
        help="also run raw vLLM and the platform with this process on every "
        "core, the vLLM worker's too: what keeping off it buys",
    )
    parser.add_argument(
        "--without-store",
        action="store_true",
        help="also run the one loop without the episode store (no "
        "checkpoints, no writer): the store's share of the overhead",
    )


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    at_once = f"{args.concurrency} at a time" if args.concurrency else ""
    print(
        f"platform overhead: {args.episodes} episodes x {args.turns} turns x {args.tokens} "
        f"tokens{', ' + at_once if at_once else ''}, {args.rounds} rounds each way",
        flush=True,
    )
    result = asyncio.run(main_async(args))
    md = report(args, result)
    print(md, flush=True)
    save("overhead", vars(args), result, md)
    return result


if __name__ == "__main__":
    main()

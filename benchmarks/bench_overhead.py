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
:mod:`agentrl.cores`); the platform's row is paired against raw's rounds on every core.
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
import itertools
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl import cores
from benchmarks.common import paired_ratio, save, table


def count_engine_steps(client) -> list[int]:
    """Count the engine core's output messages that carry sampled tokens, as the
    client's output handler receives them (one a step of the engine core): the returned
    list's one item goes up by one each."""
    core = client._engine.engine_core
    receive = core.get_output_async
    steps = [0]

    async def counted():  # the handler looks the method up on the object each time
        outputs = await receive()
        if outputs.outputs:
            steps[0] += 1
        return outputs

    core.get_output_async = counted
    return steps


def burn(us: float) -> None:
    """Spend ``us`` microseconds of this thread's CPU in Python (holding the GIL, as the
    platform's own Python does)."""
    end = time.thread_time() + us / 1e6
    while time.thread_time() < end:
        pass


class RequestTimes:
    """When each request reached the engine and when its last output reached the client,
    by episode: from them, how long after a turn ends the episode's next request goes
    out, and how long after a round starts each episode's first request does.

    Installed on the engine object (``AsyncLLM``) whose ``generate`` every path calls.
    A request's episode is its id up to its last ``-`` (the platform's
    ``<episode_id>-<serial>``; raw's ids are made to match). The wrapper adds one async
    generator frame to every output of every path alike.
    """

    def __init__(self, engine) -> None:
        self._generate = engine.generate
        engine.generate = self._timed  # looked up on the object at each call
        self._t0 = time.perf_counter()
        self._times: dict[str, list[list[float]]] = {}

    def begin(self) -> None:
        """A round starts now: forget the last one's requests."""
        self._t0 = time.perf_counter()
        self._times = {}

    def _timed(self, prompt, params, request_id: str, *args, **kwargs):
        return self._stream(self._generate(prompt, params, request_id, *args, **kwargs),
                            request_id.rpartition("-")[0])  # fmt: skip

    async def _stream(self, stream, episode: str):
        times = [time.perf_counter(), math.nan]  # its first step is the submission
        self._times.setdefault(episode, []).append(times)
        async for out in stream:
            if out.finished:
                times[1] = time.perf_counter()
            yield out

    def timing(self) -> list[list[float]]:
        """The round's request timing by episode, earliest first request first: each
        episode's first request after the round's start, then the wait before each next
        request after the turn before it ended, in seconds (what ``raw_round``'s
        ``timing`` replays)."""
        episodes = []
        for requests in self._times.values():
            requests.sort()
            episodes.append([requests[0][0] - self._t0,
                             *(b[0] - a[1] for a, b in itertools.pairwise(requests))])  # fmt: skip
        return sorted(episodes)

    def summary(self) -> dict[str, float]:
        """The round's gaps, in ms: after a turn's last output, the episode's next
        request (p50, p90 over every turn), and each episode's first request after the
        round's start (median over episodes)."""
        gaps, firsts = [], []
        for requests in self._times.values():
            requests.sort()
            firsts.append(requests[0][0] - self._t0)
            gaps += [b[0] - a[1] for a, b in itertools.pairwise(requests)]
        return {"gap_p50_ms": _quantile(gaps, 0.5) * 1e3, "gap_p90_ms": _quantile(gaps, 0.9) * 1e3,
                "first_request_ms": _quantile(firsts, 0.5) * 1e3}  # fmt: skip


def _quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``; NaN if none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Burner:
    """A thread that spends ``us`` microseconds of CPU for each :meth:`add`: work handed
    off the event loop, as the platform hands its store writes and renderings to threads.
    Between burns it waits on a queue, without the GIL, as those threads do."""

    def __init__(self, us: float) -> None:
        import queue
        import threading

        self.us = us
        self._queue: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="burner", daemon=True)
        self._thread.start()

    def add(self) -> None:
        self._queue.put(True)

    def _run(self) -> None:
        while self._queue.get():
            burn(self.us)

    async def finish(self) -> None:
        """Wait until every burn asked for is done, then end the thread."""
        self._queue.put(False)
        await asyncio.to_thread(self._thread.join)


async def raw_round(client, prompts: list[list[int]], reply: list[int], turns: int,
                    tokens: int, burn_us: float = 0.0, in_thread: bool = False,
                    timer: RequestTimes | None = None, spread_s: float = 0.0,
                    gap_s: float = 0.0, slots: int | None = None,
                    timing: list[list[float]] | None = None,
                    ) -> tuple[int, float, float]:  # fmt: skip
    """Raw ``AsyncLLM.generate``; with ``burn_us`` (a calibration), each turn also costs
    that much CPU before its request: on the event loop, delaying the request, or (with
    ``in_thread``) in a thread beside it, as the platform's own work does. With
    ``spread_s`` (a calibration), the episodes' first requests go out evenly over that
    many seconds from the round's start, episode i's ``i / len(prompts)`` of the way. With
    ``gap_s`` (a calibration), each episode waits that long, idle, before each turn after
    its first. With ``slots``, at most that many episodes run at once, the next starting
    as one ends (a run's steady state); else all start at once. With ``timing`` (a
    calibration; see :meth:`RequestTimes.timing`), episode i sends its first request
    ``timing[i][0]`` seconds after the round's start and waits ``timing[i][t]``, idle,
    after turn t - 1 before the next: another path's request timing, replayed without
    its CPU."""
    if timing is not None and (spread_s or gap_s or slots):
        raise ValueError("timing replaces spread_s, gap_s and slots; give it alone")
    if timing is not None and (len(timing) != len(prompts)
                               or any(len(t) != turns for t in timing)):  # fmt: skip
        raise ValueError(f"timing needs {turns} delays for each of the {len(prompts)} "
                         "episodes")  # fmt: skip
    from vllm import SamplingParams
    from vllm.inputs.engine import tokens_input
    from vllm.sampling_params import RequestOutputKind

    engine = client._engine
    params = SamplingParams(n=1, max_tokens=tokens, temperature=1.0, ignore_eos=True, logprobs=0,
                            detokenize=False, output_kind=RequestOutputKind.DELTA)  # fmt: skip
    sampled = 0
    burner = Burner(burn_us) if burn_us and in_thread else None
    room = asyncio.Semaphore(slots or len(prompts))  # FIFO: episodes start in order

    async def episode(i: int, prompt: list[int]) -> None:
        if spread_s:
            await asyncio.sleep(spread_s * i / len(prompts))
        if timing is not None and (wait := t0 + timing[i][0] - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        async with room:
            await turns_of(i, prompt)

    async def turns_of(i: int, prompt: list[int]) -> None:
        nonlocal sampled
        ids = list(prompt)
        for turn in range(turns):
            if turn and gap_s:
                await asyncio.sleep(gap_s)
            if turn and timing is not None and timing[i][turn] > 0:
                await asyncio.sleep(timing[i][turn])
            if burner is not None:
                burner.add()
            elif burn_us:
                burn(burn_us)
            new: list[int] = []
            async for out in engine.generate(
                tokens_input(ids), params, f"raw-{i}-{turn}.{time.monotonic_ns()}"
            ):
                new.extend(out.outputs[0].token_ids)
            sampled += len(new)
            ids += new
            if turn < turns - 1:
                ids += reply

    if timer is not None:
        timer.begin()
    t0, cpu0 = time.perf_counter(), time.process_time()
    async with asyncio.TaskGroup() as tg:
        for i, prompt in enumerate(prompts):
            tg.create_task(episode(i, prompt))
    if burner is not None:
        await burner.finish()
    return sampled, time.perf_counter() - t0, time.process_time() - cpu0


async def platform_round(client, tokenizer, episodes: int, turns: int, tokens: int, seed: int,
                         store_dir: Path, workers=None, store: bool = True,
                         timer: RequestTimes | None = None, slots: int | None = None,
                         ) -> tuple[int, float, float]:  # fmt: skip
    """The platform's episodes; through ``workers`` (a started ``WorkerRunner``) if given;
    without the episode store (no checkpoints, no writer) if not ``store``; at most
    ``slots`` episodes at once (the scheduler's concurrency), else all. Returns the
    tokens sampled, the wall time and this process's CPU time (every thread); ``timer``
    (if given) begins where the wall time does."""
    from agentrl.queue import TrajectoryQueue
    from agentrl.rollout import EpisodeRunner, RolloutConfig, Scheduler, tasks_for
    from agentrl.store import EpisodeStore, StoreWriter

    rollout = RolloutConfig(max_turns=turns, max_tokens_per_turn=tokens, ignore_eos=True)
    queue = TrajectoryQueue(episodes + 1)
    tasks = list(tasks_for("bench/Echo-v0", episodes, first_seed=seed, turns=turns))
    limits = RolloutConfig(concurrency=slots or episodes, group_size=1)
    if not store:
        runner = EpisodeRunner(client, tokenizer, rollout, checkpoint=None)
        if timer is not None:
            timer.begin()
        t0, cpu0 = time.perf_counter(), time.process_time()
        await Scheduler(runner, queue, limits).run(tasks)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    else:
        store_dir.mkdir(parents=True, exist_ok=True)
        db = EpisodeStore.open(store_dir)
        async with StoreWriter(db) as writer:
            if workers is not None:
                runner, workers.checkpoint = workers, writer.partial
            else:
                runner = EpisodeRunner(client, tokenizer, rollout, checkpoint=writer.partial)
            scheduler = Scheduler(runner, queue, limits, writer=writer)
            if timer is not None:
                timer.begin()
            t0, cpu0 = time.perf_counter(), time.process_time()
            await scheduler.run(tasks)
            await writer.flush()
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        db.close()
    sampled = sum(int(t.loss_mask.sum()) for g in queue._groups for t in g.trajectories)
    return sampled, wall, cpu


async def main_async(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    from agentrl.chat import Conversation
    from agentrl.inference import InferenceConfig, VLLMEngineClient
    from agentrl.metrics import tune_gc
    from agentrl.models import resolve_model

    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    # the exact prompt tokens and per-turn reply tokens the platform produces
    prompts = []
    for i in range(args.episodes):
        text = f"Say anything, {args.turns} times (task {i})."
        conv = Conversation(tokenizer, [{"role": "user", "content": text}])
        prompts.append(list(conv.token_ids))
    conv = Conversation(tokenizer, [{"role": "user", "content": "x"}])
    conv.add_sampled([5, 6, tokenizer.convert_tokens_to_ids("<|im_end|>")], [0.0] * 3, [0] * 3)
    conv.end_assistant_turn("..", "stop")
    reply, _ = conv.delta_for([{"role": "user", "content": "ok"}])
    config = InferenceConfig(max_model_len=1024, max_num_seqs=256)
    raw, plat = [], []
    raw_cpu, plat_cpu = [], []
    steps: dict[str, list[int]] = {"raw": [], "platform": []}
    bare, bare_cpu = [], []  # --without-store
    by_workers: dict[int, list[float]] = {n: [] for n in args.workers}
    workers_cpu: dict[int, list[float]] = {n: [] for n in args.workers}
    # --calibrate: raw with US of CPU a turn, on the loop (False) and in a thread (True)
    calib = {(us, thread): ([], []) for us in args.calibrate for thread in (False, True)}
    # --spread-start: raw with its first requests spread over MS milliseconds
    spread = {ms: ([], []) for ms in args.spread_start}
    # --idle-gap: raw waiting MS milliseconds, idle, before each next turn
    idle = {ms: ([], []) for ms in args.idle_gap}
    # --replay-timing: raw replaying the platform's request timing of the same round
    replay: tuple[list[float], list[float]] = ([], [])
    # --every-core: raw and the platform with this process on every core
    every: dict[str, tuple[list[float], list[float]]] = {"raw": ([], []), "platform": ([], [])}
    # each path's request gaps, a summary a round (RequestTimes)
    gaps: dict[str, list[dict[str, float]]] = collections.defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        async with await VLLMEngineClient.start(path, config) as client:
            placement = {"this_process_cores": sorted(os.sched_getaffinity(0)),
                         "vllm_worker_cores": sorted(cores.worker_cores())}  # fmt: skip
            stepped = count_engine_steps(client)
            timer = RequestTimes(client._engine)
            pools = {}
            for n in args.workers:  # started once (imports, tokenizer), used every round
                pools[n] = await _workers(client, tokenizer, args, n)
            try:
                tune_gc()  # as agentrl train and agentrl rollout do once started
                await raw_round(client, prompts[:8], reply, args.turns, args.tokens)  # warm-up
                await platform_round(client, tokenizer, 8, args.turns, args.tokens, 0,
                                     Path(tmp) / "w")  # fmt: skip
                if args.without_store:
                    await platform_round(client, tokenizer, 8, args.turns, args.tokens, 0,
                                         Path(tmp) / "unused", store=False)  # fmt: skip
                for n, pool in pools.items():
                    await platform_round(client, tokenizer, 8, args.turns, args.tokens, 0,
                                         Path(tmp) / f"w{n}", pool)  # fmt: skip
                slots = args.concurrency
                # raw's diagnostic rounds: (request-gap key, label, raw_round keywords, figures)
                raw_variants = [
                    *((f"spread {ms:g}", f"raw spread {ms:g} ms", {"spread_s": ms / 1000}, v)
                      for ms, v in spread.items()),
                    *((f"idle {ms:g}", f"raw idle {ms:g} ms", {"gap_s": ms / 1000}, v)
                      for ms, v in idle.items()),
                    *((f"raw+{us:g}us {thread}", f"raw+{us:g}us {'thread' if thread else 'loop'}",
                       {"burn_us": us, "in_thread": thread}, v)
                      for (us, thread), v in calib.items()),
                ]  # fmt: skip
                for r in range(args.rounds):
                    s0 = stepped[0]
                    n, wall, cpu = await raw_round(client, prompts, reply, args.turns, args.tokens,
                                                   timer=timer, slots=slots)  # fmt: skip
                    gaps["raw"].append(timer.summary())
                    raw.append(n / wall)
                    raw_cpu.append(cpu)
                    s1 = stepped[0]
                    n2, wall2, cpu2 = await platform_round(client, tokenizer, args.episodes,
                                                           args.turns, args.tokens, 0,
                                                           Path(tmp) / f"r{r}",
                                                           timer=timer, slots=slots)  # fmt: skip
                    gaps["platform"].append(timer.summary())
                    platform_timing = timer.timing()
                    plat.append(n2 / wall2)
                    plat_cpu.append(cpu2)
                    steps["raw"].append(s1 - s0)
                    steps["platform"].append(stepped[0] - s1)
                    assert n == n2 == args.episodes * args.turns * args.tokens, (n, n2)
                    line = f"  round {r + 1}: raw {raw[-1]:,.0f} tok/s, platform {plat[-1]:,.0f}"
                    if args.without_store:
                        s2 = stepped[0]
                        n3, wall3, cpu3 = await platform_round(
                            client, tokenizer, args.episodes, args.turns, args.tokens, 0,
                            Path(tmp) / "unused", store=False, timer=timer, slots=slots,
                        )  # fmt: skip
                        gaps["without store"].append(timer.summary())
                        assert n3 == n, (n, n3)
                        bare.append(n3 / wall3)
                        bare_cpu.append(cpu3)
                        steps.setdefault("without store", []).append(stepped[0] - s2)
                        line += f", without the store {bare[-1]:,.0f}"
                    for k, pool in pools.items():
                        s2 = stepped[0]
                        n3, wall3, cpu3 = await platform_round(
                            client, tokenizer, args.episodes, args.turns, args.tokens, 0,
                            Path(tmp) / f"r{r}w{k}", pool, timer=timer, slots=slots,
                        )  # fmt: skip
                        gaps[f"{k} workers"].append(timer.summary())
                        assert n3 == n, (n, n3)
                        by_workers[k].append(n3 / wall3)
                        workers_cpu[k].append(cpu3)
                        steps.setdefault(f"{k} workers", []).append(stepped[0] - s2)
                        line += f", {k} workers {by_workers[k][-1]:,.0f}"
                    if args.every_core:
                        with cores.suspended():
                            for key in ("raw", "platform"):
                                if key == "raw":
                                    n3, wall3, cpu3 = await raw_round(
                                        client, prompts, reply, args.turns, args.tokens,
                                        timer=timer, slots=slots)  # fmt: skip
                                else:
                                    n3, wall3, cpu3 = await platform_round(
                                        client, tokenizer, args.episodes, args.turns,
                                        args.tokens, 0, Path(tmp) / f"r{r}e", timer=timer,
                                        slots=slots)  # fmt: skip
                                assert n3 == n, (n, n3)
                                gaps[f"every core {key}"].append(timer.summary())
                                every[key][0].append(n3 / wall3)
                                every[key][1].append(cpu3)
                                line += f", {key} on every core {n3 / wall3:,.0f}"
                    for key, label, kwargs, (tps, cpus) in raw_variants:
                        n3, wall3, cpu3 = await raw_round(client, prompts, reply, args.turns,
                                                          args.tokens, timer=timer, slots=slots,
                                                          **kwargs)  # fmt: skip
                        gaps[key].append(timer.summary())
                        tps.append(n3 / wall3)
                        cpus.append(cpu3)
                        line += f", {label} {tps[-1]:,.0f}"
                    if args.replay_timing:
                        n3, wall3, cpu3 = await raw_round(client, prompts, reply, args.turns,
                                                          args.tokens, timer=timer,
                                                          timing=platform_timing)  # fmt: skip
                        gaps["replay timing"].append(timer.summary())
                        replay[0].append(n3 / wall3)
                        replay[1].append(cpu3)
                        line += f", raw replaying the platform's timing {n3 / wall3:,.0f}"
                    print(line + " tok/s", flush=True)
            finally:
                for pool in pools.values():
                    await pool.close()
    raw_m, plat_m = statistics.median(raw), statistics.median(plat)

    def path(tps: list[float], cpus: list[float], gaps_of: str,
             cpu_key: str = "cpu_ms_per_round") -> dict:  # fmt: skip
        """One path's figures against raw's rounds."""
        return {"tokens_per_s": statistics.median(tps),
                "ratio": statistics.median(tps) / raw_m,
                "paired_ratio": paired_ratio(tps, raw), "rounds": tps,
                cpu_key: statistics.median(cpus) * 1000,
                "request_gaps": _gaps(gaps[gaps_of])}  # fmt: skip

    workers = {str(k): {**path(v, workers_cpu[k], f"{k} workers", "main_cpu_ms_per_round"),
                        "engine_steps_per_round": statistics.median(steps[f"{k} workers"])}
               for k, v in by_workers.items() if v}  # fmt: skip
    without_store = {**path(bare, bare_cpu, "without store"),
                     "engine_steps_per_round": statistics.median(steps["without store"]),
                     } if bare else None  # fmt: skip
    return {"raw_tokens_per_s": raw_m, "platform_tokens_per_s": plat_m,
            "ratio": plat_m / raw_m, "paired_ratio": paired_ratio(plat, raw),
            "raw_rounds": raw, "platform_rounds": plat,
            "raw_cpu_ms_per_round": statistics.median(raw_cpu) * 1000,
            "platform_cpu_ms_per_round": statistics.median(plat_cpu) * 1000,
            "raw_engine_steps_per_round": statistics.median(steps["raw"]),
            "platform_engine_steps_per_round": statistics.median(steps["platform"]),
            "raw_request_gaps": _gaps(gaps["raw"]),
            "platform_request_gaps": _gaps(gaps["platform"]),
            "workers": workers, "without_store": without_store,
            "calibration": [{"burn_us": us, "in_thread": thread,
                             **path(tps, cpus, f"raw+{us:g}us {thread}")}
                            for (us, thread), (tps, cpus) in calib.items()],
            "spread_start": [{"spread_ms": ms, **path(tps, cpus, f"spread {ms:g}")}
                             for ms, (tps, cpus) in spread.items()],
            "idle_gap": [{"gap_ms": ms, **path(tps, cpus, f"idle {ms:g}")}
                         for ms, (tps, cpus) in idle.items()],
            "replay_timing": path(*replay, "replay timing") if replay[0] else None,
            "placement": placement,
            "every_core": {
                "raw": path(*every["raw"], "every core raw"),
                # the platform against raw's rounds on every core (the overhead without
                # keeping off the worker's cores)
                "platform": {**path(*every["platform"], "every core platform"),
                             "ratio": (statistics.median(every["platform"][0])
                                       / statistics.median(every["raw"][0])),
                             "paired_ratio": paired_ratio(*(every[k][0] for k in
                                                            ("platform", "raw")))},
            } if every["raw"][0] else None,
            "tokens_per_round": args.episodes * args.turns * args.tokens}  # fmt: skip


async def _workers(client, tokenizer, args: argparse.Namespace, n: int):
    """A started ``WorkerRunner`` of ``n`` rollout worker processes."""
    from agentrl.rollout import RolloutConfig
    from agentrl.rollout.workers import WorkerRunner

    rollout = RolloutConfig(max_turns=args.turns, max_tokens_per_turn=args.tokens,
                            ignore_eos=True, workers=n)  # fmt: skip
    pool = WorkerRunner(client, tokenizer, rollout, imports=["benchmarks.common"])
    await pool.start()
    return pool


def _gaps(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Each request-gap figure's median over the rounds."""
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


def _gap_cells(g: dict[str, float]) -> list[str]:
    return [f"{g['gap_p50_ms']:.2f} / {g['gap_p90_ms']:.2f}", f"{g['first_request_ms']:.1f}"]


def _raw_row(label: str, c: dict) -> list:
    """A table row for one of raw vLLM's diagnostic rounds (no engine-step count)."""
    return [label, c["tokens_per_s"], c["ratio"], _interval(c["paired_ratio"]),
            c["cpu_ms_per_round"], "", *_gap_cells(c["request_gaps"])]  # fmt: skip


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


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=None, metavar="C",
                        help="run at most C episodes at once, the next starting as one ends "
                        "(a run's steady state); default: all of them at once")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", default="2",
                        help="also run the platform through this many rollout worker "
                        "processes (comma-separated; '' for none)")  # fmt: skip
    parser.add_argument("--calibrate", default="", metavar="US[,US]",
                        help="also run raw vLLM with this many microseconds of CPU a turn, "
                        "on the loop and in a thread: what client CPU costs the engine "
                        "here")  # fmt: skip
    parser.add_argument("--spread-start", default="", metavar="MS[,MS]",
                        help="also run raw vLLM with its episodes' first requests spread "
                        "evenly over this many milliseconds: what a slow episode start "
                        "costs the engine here")  # fmt: skip
    parser.add_argument("--idle-gap", default="", metavar="MS[,MS]",
                        help="also run raw vLLM with each episode waiting this many "
                        "milliseconds, idle, before each next turn: what the platform's "
                        "gap between turns costs the engine here, without its CPU")  # fmt: skip
    parser.add_argument("--replay-timing", action="store_true",
                        help="also run raw vLLM sending each request when the platform's "
                        "round before it did (each episode's first request after the "
                        "round's start, each next one after its turn's end), idle: what "
                        "the platform's request timing costs the engine, without its "
                        "CPU")  # fmt: skip
    parser.add_argument("--every-core", action="store_true",
                        help="also run raw vLLM and the platform with this process on every "
                        "core, the vLLM worker's too: what keeping off it buys")  # fmt: skip
    parser.add_argument("--without-store", action="store_true",
                        help="also run the one loop without the episode store (no "
                        "checkpoints, no writer): the store's share of the overhead")  # fmt: skip
    args = parser.parse_args(argv)
    if args.concurrency is not None and not 1 <= args.concurrency <= args.episodes:
        parser.error(f"--concurrency takes 1 to --episodes ({args.episodes}), "
                     f"got {args.concurrency}")  # fmt: skip
    if args.replay_timing and args.concurrency is not None:
        parser.error("--replay-timing replays every episode at once; leave out --concurrency")
    args.workers = [int(w) for w in str(args.workers).split(",") if w.strip()]
    for option, unit in (("calibrate", "microseconds"), ("spread_start", "milliseconds"),
                         ("idle_gap", "milliseconds")):  # fmt: skip
        values = [float(v) for v in str(getattr(args, option)).split(",") if v.strip()]
        if any(v <= 0 for v in values):
            parser.error(f"--{option.replace('_', '-')} takes {unit} above 0, got {values}")
        setattr(args, option, values)
    at_once = f"{args.concurrency} at a time" if args.concurrency else ""
    print(f"platform overhead: {args.episodes} episodes x {args.turns} turns x {args.tokens} "
          f"tokens{', ' + at_once if at_once else ''}, {args.rounds} rounds each way",
          flush=True)  # fmt: skip
    result = asyncio.run(main_async(args))
    rows = [
        ["raw AsyncLLM", result["raw_tokens_per_s"], 1.0, "", result["raw_cpu_ms_per_round"],
         result["raw_engine_steps_per_round"], *_gap_cells(result["raw_request_gaps"])],
        ["agentrl episode loop + store", result["platform_tokens_per_s"], result["ratio"],
         _interval(result["paired_ratio"]), result["platform_cpu_ms_per_round"],
         result["platform_engine_steps_per_round"],
         *_gap_cells(result["platform_request_gaps"])],
    ]  # fmt: skip
    if (w := result["without_store"]) is not None:
        rows.append(["agentrl episode loop, no store (diagnostic)", w["tokens_per_s"],
                     w["ratio"], _interval(w["paired_ratio"]), w["cpu_ms_per_round"],
                     w["engine_steps_per_round"], *_gap_cells(w["request_gaps"])])  # fmt: skip
    for k, w in result["workers"].items():
        rows.append([f"agentrl, {k} rollout worker processes + store", w["tokens_per_s"],
                     w["ratio"], _interval(w["paired_ratio"]), w["main_cpu_ms_per_round"],
                     w["engine_steps_per_round"], *_gap_cells(w["request_gaps"])])  # fmt: skip
    if (e := result["every_core"]) is not None:
        rows.append(_raw_row("raw AsyncLLM, this process on every core (diagnostic)", e["raw"]))
        rows.append(_raw_row("agentrl episode loop + store, this process on every core, "
                             "against raw on every core (diagnostic)", e["platform"]))  # fmt: skip
    for c in result["calibration"]:
        where = "in a thread" if c["in_thread"] else "on the event loop"
        rows.append(_raw_row(f"raw AsyncLLM + {c['burn_us']:g} us of CPU a turn {where} "
                             "(calibration)", c))  # fmt: skip
    for c in result["spread_start"]:
        rows.append(_raw_row(f"raw AsyncLLM, first requests spread over {c['spread_ms']:g} ms "
                             "(calibration)", c))  # fmt: skip
    for c in result["idle_gap"]:
        rows.append(_raw_row(f"raw AsyncLLM, {c['gap_ms']:g} ms idle before each next turn "
                             "(calibration)", c))  # fmt: skip
    if (c := result["replay_timing"]) is not None:
        rows.append(_raw_row("raw AsyncLLM replaying the platform's request timing, idle "
                             "(calibration)", c))  # fmt: skip
    shape = f"{args.episodes} episodes, {at_once or 'all at once'}"
    md = ("### Platform overhead against raw vLLM (same tokens, same concurrency)\n\n"
          f"{shape}; {args.turns} turns of {args.tokens} tokens each.\n\n") + table(
        ["path", "tokens/s (median)", "ratio", "paired ratio (95% interval)",
         "this process's CPU ms a round (median)", "engine steps a round (median)",
         "next request after a turn, ms (p50 / p90)", "first request of an episode, ms"],
        rows,
    )  # fmt: skip
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
    best = max([result["ratio"], *(w["ratio"] for w in result["workers"].values())])
    md += (f"\n\nTarget: ratio >= 0.95. One loop: {'met' if result['ratio'] >= 0.95 else 'NOT met'}"
           f"; best: {best:.3f}. The paired ratio is the median of each round's platform "
           f"figure over that round's raw one; "
           f"{_verdict(result['paired_ratio'], 0.95)}.")  # fmt: skip
    print(md, flush=True)
    save("overhead", vars(args), result, md)
    return result


if __name__ == "__main__":
    main()

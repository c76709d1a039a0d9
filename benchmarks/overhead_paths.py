"""The paths the overhead benchmark measures, and the instruments it measures them with.

:func:`raw_round`: raw ``AsyncLLM.generate`` (with its calibrations: CPU a turn on the
loop or in a :class:`Burner` thread, a spread start, an idle gap, another path's replayed
timing); :func:`platform_round`: agentrl's episode loop on the same engine, with or
without the store, in this process or through rollout workers (:func:`start_workers`).
:func:`count_engine_steps` and :class:`RequestTimes` watch the engine both ways. The
benchmark itself, its rounds and its table, is ``benchmarks/bench_overhead.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import time
from pathlib import Path

from benchmarks.common import quantile


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
        return self._stream(
            self._generate(prompt, params, request_id, *args, **kwargs),
            request_id.rpartition("-")[0],
        )

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
            episodes.append(
                [requests[0][0] - self._t0, *(b[0] - a[1] for a, b in itertools.pairwise(requests))]
            )
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
        return {
            "gap_p50_ms": quantile(gaps, 0.5) * 1e3,
            "gap_p90_ms": quantile(gaps, 0.9) * 1e3,
            "first_request_ms": quantile(firsts, 0.5) * 1e3,
        }


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


def _check_timing(
    timing: list[list[float]] | None, episodes: int, turns: int, other_pacing: bool
) -> None:
    """``timing`` (see :func:`raw_round`) comes alone, with ``turns`` delays per episode."""
    if timing is not None and other_pacing:
        raise ValueError("timing replaces spread_s, gap_s and slots; give it alone")
    if timing is not None and (len(timing) != episodes or any(len(t) != turns for t in timing)):
        raise ValueError(f"timing needs {turns} delays for each of the {episodes} episodes")


def _raw_params(tokens: int):
    """The raw path's sampling: ``tokens`` tokens, one logprob each, token deltas, no text."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        n=1,
        max_tokens=tokens,
        temperature=1.0,
        ignore_eos=True,
        logprobs=0,
        detokenize=False,
        output_kind=RequestOutputKind.DELTA,
    )


async def raw_round(
    client,
    prompts: list[list[int]],
    reply: list[int],
    turns: int,
    tokens: int,
    burn_us: float = 0.0,
    in_thread: bool = False,
    timer: RequestTimes | None = None,
    spread_s: float = 0.0,
    gap_s: float = 0.0,
    slots: int | None = None,
    timing: list[list[float]] | None = None,
) -> tuple[int, float, float]:
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
    _check_timing(timing, len(prompts), turns, bool(spread_s or gap_s or slots))
    from vllm.inputs.engine import tokens_input

    engine = client._engine
    params = _raw_params(tokens)
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


async def platform_round(
    client,
    tokenizer,
    episodes: int,
    turns: int,
    tokens: int,
    seed: int,
    store_dir: Path,
    workers=None,
    store: bool = True,
    timer: RequestTimes | None = None,
    slots: int | None = None,
) -> tuple[int, float, float]:
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


async def start_workers(client, tokenizer, args: argparse.Namespace, n: int):
    """A started ``WorkerRunner`` of ``n`` rollout worker processes."""
    from agentrl.rollout import RolloutConfig
    from agentrl.rollout.workers import WorkerRunner

    rollout = RolloutConfig(
        max_turns=args.turns, max_tokens_per_turn=args.tokens, ignore_eos=True, workers=n
    )
    pool = WorkerRunner(client, tokenizer, rollout, imports=["benchmarks.common"])
    await pool.start()
    return pool

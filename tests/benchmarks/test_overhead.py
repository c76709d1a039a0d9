"""The overhead bench's calibration: a turn's CPU spent on the event loop, or in a thread
beside it, as much as asked for."""

from __future__ import annotations

import asyncio
import time

import pytest

from benchmarks.overhead_paths import Burner, RequestTimes, burn, raw_round


def test_burn_spends_the_cpu_asked_for_in_the_calling_thread() -> None:
    t0 = time.thread_time()
    burn(20_000)
    assert time.thread_time() - t0 >= 0.020


def test_burner_spends_every_turns_cpu_in_its_thread_not_the_loops() -> None:
    async def run() -> tuple[float, float]:
        burner = Burner(2_000)
        loop0, all0 = time.thread_time(), time.process_time()
        for _ in range(20):  # 20 turns of 2 ms each
            burner.add()
        await burner.finish()
        return time.thread_time() - loop0, time.process_time() - all0

    loop_cpu, all_cpu = asyncio.run(run())
    assert all_cpu >= 0.040  # every turn's 2 ms was spent ...
    assert loop_cpu < 0.020  # ... and not on the loop's thread


class _Output:
    def __init__(self, finished: bool) -> None:
        self.finished = finished


class _Engine:
    """An engine whose requests each take ``step`` seconds and two outputs."""

    def __init__(self, step: float) -> None:
        self.step = step

    async def generate(self, prompt, params, request_id):
        await asyncio.sleep(self.step / 2)
        yield _Output(False)
        await asyncio.sleep(self.step / 2)
        yield _Output(True)


def test_request_times_measure_the_wait_before_each_next_request_and_the_first() -> None:
    engine = _Engine(0.01)
    timer = RequestTimes(engine)

    async def episode(i: int, start: float, think: float) -> None:
        await asyncio.sleep(start)
        for turn in range(3):
            async for _out in engine.generate([1], None, f"ep-{i}-{turn}"):
                pass
            await asyncio.sleep(think)  # the client's work between turns

    async def run() -> dict[str, float]:
        timer.begin()
        await asyncio.gather(*(episode(i, 0.03, 0.02) for i in range(4)))
        return timer.summary()

    s = asyncio.run(run())
    assert 18 <= s["gap_p50_ms"] < 30, s  # the 20 ms between turns, not the 10 ms requests
    assert 18 <= s["gap_p90_ms"] < 40, s
    assert 28 <= s["first_request_ms"] < 45, s  # each episode's 30 ms start
    # the episode is the id up to its last "-": "ep-0-1" and "ep-0-2" are one episode's
    assert sorted(timer._times) == ["ep-0", "ep-1", "ep-2", "ep-3"]


class _Completion:
    def __init__(self, token_ids: list[int]) -> None:
        self.token_ids = token_ids


class _TokenOutput(_Output):
    def __init__(self, finished: bool, token_ids: list[int]) -> None:
        super().__init__(finished)
        self.outputs = [_Completion(token_ids)]


class _TokenEngine:
    """Answers each request with ``params.max_tokens`` tokens after ``step`` seconds."""

    def __init__(self, step: float) -> None:
        self.step = step

    async def generate(self, prompt, params, request_id):
        await asyncio.sleep(self.step)
        yield _TokenOutput(True, [7] * params.max_tokens)


def _raw(
    engine, timer: RequestTimes, episodes: int, turns: int, **kwargs
) -> tuple[dict[str, float], float]:
    """``raw_round`` of ``episodes`` 5-token turns against ``engine``: every token sampled;
    the round's request gaps and CPU time."""

    class Client:
        _engine = engine

    sampled, _wall, cpu = asyncio.run(
        raw_round(Client, [[1, 2, 3]] * episodes, [4], turns, 5, timer=timer, **kwargs)
    )
    assert sampled == episodes * turns * 5
    return timer.summary(), cpu


def test_raw_rounds_spread_their_first_requests_when_asked() -> None:
    pytest.importorskip("vllm")

    engine = _TokenEngine(0.002)
    timer = RequestTimes(engine)

    def first_request_ms(spread_s: float) -> float:
        return _raw(engine, timer, 16, 2, spread_s=spread_s)[0]["first_request_ms"]

    assert first_request_ms(0.0) < 10
    # 16 episodes over 80 ms: episode i at i * 5 ms, the median at about 40 ms
    assert 35 <= first_request_ms(0.08) < 60


def test_raw_rounds_wait_idle_between_turns_when_asked() -> None:
    pytest.importorskip("vllm")

    engine = _TokenEngine(0.002)
    timer = RequestTimes(engine)
    s, _cpu = _raw(engine, timer, 8, 3, gap_s=0.0)
    assert s["gap_p50_ms"] < 5, s
    s, cpu = _raw(engine, timer, 8, 3, gap_s=0.03)
    # each next request waits the 30 ms after the turn's end; the first does not
    assert 29 <= s["gap_p50_ms"] < 45, s
    assert s["first_request_ms"] < 10, s
    assert cpu < 0.05  # idle: 16 waits of 30 ms are nearly half a second of wall time


def test_raw_rounds_keep_at_most_their_slots_busy_when_asked() -> None:
    pytest.importorskip("vllm")

    class Engine(_TokenEngine):
        def __init__(self) -> None:
            super().__init__(0.002)
            self.open = self.most = 0

        async def generate(self, prompt, params, request_id):
            self.open += 1
            self.most = max(self.most, self.open)
            try:
                async for out in super().generate(prompt, params, request_id):
                    yield out
            finally:
                self.open -= 1

    engine = Engine()
    timer = RequestTimes(engine)
    s, _cpu = _raw(engine, timer, 16, 2, slots=4)  # every episode ran, four at a time
    assert engine.most == 4
    # the later episodes waited for a slot: 4 waves of two 2 ms turns
    assert s["first_request_ms"] >= 4
    _raw(engine, timer, 16, 2)
    assert engine.most == 16  # without slots, all at once


def test_raw_rounds_replay_another_paths_request_timing() -> None:
    """``RequestTimes.timing`` gives each episode's first-request offset and its waits
    between turns, earliest episode first; ``raw_round(timing=...)`` sends its requests
    that late again, so the replayed round's timing reads back as what it replayed."""
    pytest.importorskip("vllm")

    engine = _TokenEngine(0.002)
    timer = RequestTimes(engine)
    # episode i: first request at 10 * (4 - i) ms, then 5 * i ms idle before each next turn
    timing = [[0.01 * (4 - i), 0.005 * i, 0.005 * i] for i in range(4)]
    _raw(engine, timer, 4, 3, timing=timing)
    replayed = timer.timing()
    assert len(replayed) == 4 and all(len(t) == 3 for t in replayed)
    # earliest first: the episode that started at 10 ms (i = 3, 15 ms between turns) leads
    expected = sorted(timing)
    for got, want in zip(replayed, expected, strict=True):
        for g, w in zip(got, want, strict=True):
            assert w <= g < w + 0.008, (replayed, expected)
    with pytest.raises(ValueError, match="alone"):
        _raw(engine, timer, 4, 3, timing=timing, gap_s=0.01)
    with pytest.raises(ValueError, match="3 delays for each of the 4"):
        _raw(engine, timer, 4, 3, timing=timing[:3])


def _shape(value: object) -> object:
    """Keys all the way down (a list by its first item): what a result file holds."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value and isinstance(value[0], dict | list) else []
    return "number" if isinstance(value, int | float) and not isinstance(value, bool) else value


def _filled(args) -> object:
    """Figures of ``args.rounds`` made-up rounds of every path ``args`` asks for."""
    from benchmarks.bench_overhead import Figures, _raw_variants

    keys = ["raw", "platform", *(f"{k} workers" for k in args.workers)]
    keys += ["without store"] * args.without_store + [k for k, _l, _kw in _raw_variants(args)]
    keys += ["replay timing"] * args.replay_timing
    keys += ["every core raw", "every core platform"] * args.every_core
    figures = Figures()
    gaps = {"gap_p50_ms": 1.0, "gap_p90_ms": 2.0, "first_request_ms": 3.0}
    for r in range(args.rounds):
        for i, key in enumerate(keys):
            figures.add(key, 6144, 1.0 + 0.01 * (r + i), 0.5, gaps)
            figures.steps[key].append(100 + r)
    return figures


def test_the_result_file_keeps_the_shape_of_the_recorded_one() -> None:
    """The summary of made-up rounds, with the settings of the recorded run, has exactly
    the keys of ``benchmarks/results/overhead.json``; with every diagnostic asked for,
    each has its figures and its table row."""
    import argparse
    import json

    from benchmarks.bench_overhead import parse_args, summarize
    from benchmarks.common import RESULTS
    from benchmarks.overhead_report import report

    recorded = json.loads((RESULTS / "overhead.json").read_text())
    args = argparse.Namespace(**{**recorded["settings"], "rounds": 5})
    placement = {"this_process_cores": [1], "vllm_worker_cores": [0]}
    result = summarize(args, _filled(args), placement)
    assert _shape(result) == _shape(recorded["results"])

    every = parse_args(
        [
            "--rounds",
            "5",
            "--workers",
            "2",
            "--calibrate",
            "50",
            "--spread-start",
            "10",
            "--idle-gap",
            "5",
            "--replay-timing",
            "--every-core",
            "--without-store",
        ]
    )
    result = summarize(every, _filled(every), placement)
    assert set(result["workers"]) == {"2"} and result["without_store"] is not None
    assert [c["in_thread"] for c in result["calibration"]] == [False, True]
    assert result["replay_timing"] and result["every_core"]["platform"]["ratio"] > 0
    md = report(every, result)
    for label in (
        "2 rollout worker processes",
        "no store",
        "every core",
        "50 us of CPU",
        "spread over 10 ms",
        "5 ms idle",
        "replaying the platform's request timing",
    ):
        assert label in md, label

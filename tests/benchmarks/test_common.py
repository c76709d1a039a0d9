"""The benchmarks' paired ratio: the median of per-round ratios and its bootstrap interval."""

from __future__ import annotations

import random

import pytest

from benchmarks.common import paired_ratio


def test_paired_ratio_is_the_median_of_round_ratios_inside_its_interval() -> None:
    rng = random.Random(1)
    raw = [rng.uniform(6000, 9000) for _ in range(31)]  # a machine with slow spells
    platform = [r * rng.uniform(0.90, 0.96) for r in raw]  # each round 4-10% below its raw
    r = paired_ratio(platform, raw)
    ratios = sorted(p / b for p, b in zip(platform, raw, strict=True))
    assert r["median"] == pytest.approx(ratios[15])
    assert 0.90 <= r["low"] <= r["median"] <= r["high"] <= 0.96
    assert r["high"] - r["low"] < 0.04  # the pairing takes out the spells
    assert paired_ratio(platform, raw) == r  # seeded: the same interval each time


def test_paired_ratio_interval_narrows_with_rounds_and_is_exact_when_rounds_agree() -> None:
    assert paired_ratio([9.0] * 5, [10.0] * 5) == {
        "median": 0.9,
        "low": 0.9,
        "high": 0.9,
        "rounds": 5,
    }
    rng = random.Random(2)
    widths = []
    for n in (7, 61):
        raw = [1.0] * n
        plat = [rng.gauss(0.93, 0.03) for _ in range(n)]
        r = paired_ratio(plat, raw)
        widths.append(r["high"] - r["low"])
    assert widths[1] < widths[0]


def test_paired_ratio_refuses_unpaired_rounds() -> None:
    with pytest.raises(ValueError, match="as many rounds"):
        paired_ratio([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="at least one"):
        paired_ratio([], [])


def test_paired_ratio_interval_covers_the_true_median_about_95_in_100_times() -> None:
    rng = random.Random(3)
    covered = 0
    for trial in range(200):
        ratios = [rng.gauss(0.93, 0.03) for _ in range(31)]  # the true median is 0.93
        r = paired_ratio(ratios, [1.0] * 31, resamples=500, seed=trial)
        covered += r["low"] <= 0.93 <= r["high"]
    assert 0.88 * 200 <= covered <= 0.985 * 200, covered  # a min-max span covers ~all


def test_quantile_is_the_nearest_rank_and_nan_without_values() -> None:
    import math

    from benchmarks.common import quantile

    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert [quantile(values, q) for q in (0.0, 0.5, 0.99, 1.0)] == [1.0, 3.0, 5.0, 5.0]
    assert quantile([7.0], 0.9) == 7.0
    assert math.isnan(quantile([], 0.5))


def test_repeat_and_timed_measure_each_call() -> None:
    import asyncio
    import time

    from benchmarks.common import repeat, timed, timed_async

    calls = []
    seconds = repeat(lambda: (calls.append(1), time.sleep(0.01)), 3)
    assert len(seconds) == 3 == len(calls) and all(s >= 0.01 for s in seconds)
    took, value = timed(lambda: "done")
    assert value == "done" and 0 <= took < 1

    async def later() -> int:
        await asyncio.sleep(0.01)
        return 4

    took, value = asyncio.run(timed_async(later))
    assert value == 4 and took >= 0.01


def test_save_writes_the_result_file_and_the_markdown_when_asked(tmp_path, monkeypatch) -> None:
    import json

    import benchmarks.common as common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(common, "end_quietly", lambda: None)  # keep this process's output
    monkeypatch.setattr(common, "machine", lambda: {"cpu": "test"})  # no torch/vLLM import
    path = common.save("demo", {"rounds": 3}, {"ratio": 0.97}, "| a |", markdown_file=True)
    saved = json.loads(path.read_text())
    assert path == tmp_path / "demo.json"
    assert set(saved) == {"benchmark", "when", "machine", "settings", "results", "markdown"}
    assert (saved["settings"], saved["results"]) == ({"rounds": 3}, {"ratio": 0.97})
    assert (tmp_path / "demo.md").read_text() == "| a |\n"
    common.save("plain", {}, {}, "| b |")
    assert not (tmp_path / "plain.md").exists()


def test_make_bench_echoes_progress_lines_not_a_warnings_source_line() -> None:
    from benchmarks.run_all import progress_lines

    log = (
        "platform overhead: 64 episodes\n"
        "/x/dispatcher.py:138: FutureWarning: `reduce_op` is deprecated\n"
        '  if hasattr(value, "__dict__"):\n'
        "[W1207 10:14:24 utils.cpp:68] Warning: NUMA binding\n"  # not Python's: kept
        "  round 1: raw 4,711 tok/s\n"
    )
    assert progress_lines(log) == ["  round 1: raw 4,711 tok/s"]

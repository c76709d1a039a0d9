"""The benchmarks' one harness: timing, repetition, result files, tables, envs.

Every benchmark prints a Markdown table and writes ``benchmarks/results/NAME.json``
(:func:`save`) with the machine, the package versions and the settings it ran with.
Figures that are compared are measured side by side in the same process, one after the
other, so a noisy machine moves both; :func:`paired_ratio` compares such rounds. A
measurement is timed with :func:`timed` / :func:`timed_async`, repeated with
:func:`repeat`, and summarised with :func:`quantile` (or ``statistics.median``).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import platform
import random
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from agentrl.cli import end_quietly, quiet_vllm
from agentrl.env import AsyncTextEnv, register_env

quiet_vllm()  # only vLLM's errors: the tables are the output

RESULTS = Path(__file__).resolve().parent / "results"
T = TypeVar("T")


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        git = ["git", "rev-parse", "--short", "HEAD"]
        here = Path(__file__).parent
        rev = subprocess.run(git, capture_output=True, text=True, cwd=here, timeout=10).stdout
        rev = rev.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    versions = {}
    for name in ("torch", "vllm", "transformers", "trl"):
        try:
            versions[name] = __import__(name).__version__
        except Exception:  # a benchmark that does not need it still runs
            versions[name] = None
    gpu = None
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except Exception:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": mem_gib,
        "gpu": gpu,
        "python": platform.python_version(),
        "agentrl_commit": rev,
        **versions,
    }


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    """Wall seconds of one call of ``fn``, and what it returned."""
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


async def timed_async(fn: Callable[[], Awaitable[T]]) -> tuple[float, T]:
    """Wall seconds of one awaited call of ``fn``, and what it returned."""
    started = time.perf_counter()
    result = await fn()
    return time.perf_counter() - started, result


def repeat(fn: Callable[[], Any], times: int) -> list[float]:
    """Wall seconds of each of ``times`` calls of ``fn``, one after the other."""
    return [timed(fn)[0] for _ in range(times)]


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` by nearest rank (index ``round(q * (n - 1))`` of
    the sorted values, no interpolation); NaN when there are none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def paired_ratio(
    values: Sequence[float], baseline: Sequence[float], *, resamples: int = 2000, seed: int = 0
) -> dict[str, float]:
    """The median of each round's ``values[i] / baseline[i]``, with a 95% interval.

    The rounds of the two were measured one right after the other, so a slow spell of
    the machine moves both of a pair: their ratio is steadier than the ratio of the two
    medians. The interval is a percentile bootstrap over the rounds (``resamples``
    draws of as many rounds, with replacement, from a seeded generator): where it
    spans a target, this many rounds on this machine cannot say which side the figure
    is on.
    """
    if len(values) != len(baseline) or not values:
        raise ValueError(
            f"paired_ratio needs as many rounds of each, at least one; got "
            f"{len(values)} and {len(baseline)}"
        )
    ratios = [v / b for v, b in zip(values, baseline, strict=True)]
    rng = random.Random(seed)
    medians = sorted(
        statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples)
    )
    low, high = medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]
    return {"median": statistics.median(ratios), "low": low, "high": high, "rounds": len(ratios)}


def save(
    name: str, settings: dict[str, Any], results: Any, markdown: str, *, markdown_file: bool = False
) -> Path:
    """Write ``results/NAME.json`` (and with ``markdown_file`` the table as ``NAME.md``)."""
    RESULTS.mkdir(exist_ok=True)
    if markdown_file:
        (RESULTS / f"{name}.md").write_text(markdown + "\n")
    path = RESULTS / f"{name}.json"
    payload = {
        "benchmark": name,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine(),
        "settings": settings,
        "results": results,
        "markdown": markdown,
    }
    path.write_text(json.dumps(payload, indent=2, default=str))
    # The table is out: what the interpreter prints while it tears down vLLM (hundreds of
    # "nanobind: leaked ..." lines from triton) goes nowhere, as after an agentrl command.
    end_quietly()
    return path


class EchoEnv(AsyncTextEnv):
    """A zero-cost multi-turn env: replies "ok" to every turn, ends after ``turns`` turns.

    ``step_s`` makes each step wait (an awaited sleep, like a tool or a remote env that
    takes that long without using the CPU).
    """

    def __init__(self, turns: int = 3, step_s: float = 0.0) -> None:
        self.turns = turns
        self.step_s = step_s
        self._t = 0

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        await super().areset(seed=seed)
        self._t = 0
        return f"Say anything, {self.turns} times (task {seed}).", {}

    async def astep(self, action: str):
        if self.step_s:
            await asyncio.sleep(self.step_s)
        self._t += 1
        done = self._t >= self.turns
        return "ok", float(done), done, False, {}

    def get_state(self) -> dict[str, Any]:
        return {"t": self._t}

    def set_state(self, state: dict[str, Any]) -> None:
        self._t = int(state["t"])


register_env("bench/Echo-v0", "benchmarks.common:EchoEnv")

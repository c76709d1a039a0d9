"""The health rules' cost per optimizer step, against the calculator demo's step time.

    python benchmarks/bench_health.py [--steps 200] [--repeat 5]

A demo-sized step: 16 groups x 8 episodes (``examples/calculator_agent/config.toml``),
each 1-3 assistant turns of up to 40 sampled tokens with a tool result between turns.
Measured, per step: :func:`agentrl.health.step_signals` over those groups (the metrics
the rules need that the trainer does not compute), each rule's ``check`` over a history
of ``--steps`` rows, and :meth:`HealthWatch.observe` in all (every rule plus the
once-per-trouble bookkeeping). The reference step time is the demo's RL stage as
measured in the README: 30 steps in 290 s on the project's 2-core machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from agentrl.config import HealthConfig
from agentrl.health import HealthWatch, default_rules, step_signals
from agentrl.types import Group, Task, TokenSpan, Trajectory
from benchmarks.common import repeat, save, table

DEMO_STEP_S = 290 / 30
"""The calculator demo's seconds per RL step (README: 30 steps in 290 s, 2 CPU cores)."""


def demo_groups(rng: np.random.Generator, groups: int = 16, size: int = 8) -> list[Group]:
    """A step's groups, shaped like the calculator demo's episodes."""
    out = []
    for g in range(groups):
        trajectories = []
        for e in range(size):
            ids, spans, messages = [1] * 30, [TokenSpan("prompt", 0, 30, 0)], []
            turns = int(rng.integers(1, 4))
            for turn in range(turns):
                n = int(rng.integers(8, 41))
                spans.append(TokenSpan("assistant", len(ids), len(ids) + n, turn))
                ids += rng.integers(100, 30_000, n).tolist()
                messages.append({"role": "assistant", "content": f"call {g} {e} {turn}"})
                if turn < turns - 1:
                    spans.append(TokenSpan("tool", len(ids), len(ids) + 6, turn + 1))
                    ids += [2] * 6
                    messages.append({"role": "tool", "content": str(int(rng.integers(99)))})
            mask = np.zeros(len(ids), np.int8)
            for s in spans[1:]:
                mask[s.start : s.end] = s.kind == "assistant"
            trajectories.append(
                Trajectory(
                    episode_id=f"t{g}/{e}",
                    task_id=f"t{g}",
                    env_id="calc",
                    seed=g,
                    token_ids=ids,
                    logprobs=np.where(mask == 1, -rng.random(len(ids)), np.nan),
                    versions=np.where(mask == 1, 0, -1),
                    loss_mask=mask,
                    spans=tuple(spans),
                    messages=messages,
                    turn_rewards=[1.0],
                    reward=float(rng.random() < 0.5),
                    status="finished",
                )
            )
        out.append(Group(Task(f"t{g}", "calc", g), size, trajectories))
    return out


def timed(fn: Any, times: int) -> float:
    """Median seconds of one call of ``fn`` over ``times`` timings."""
    return statistics.median(repeat(fn, times))


def measure(steps: int, repeat: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    groups = demo_groups(rng)
    row = {
        "step": 1,
        **step_signals(groups),
        "kl": 0.01,
        "logprob_gap_fresh": 0.01,
        "clip_fraction": 0.02,
        "masked_fraction": 0.0,
        "staleness_mean": 0.5,
        "reward_mean": 0.5,
        "success_rate": 0.5,
    }
    watch = HealthWatch(HealthConfig(), max_staleness=1)
    for step in range(1, steps + 1):
        watch.observe(step, {**row, "step": step, "entropy": 0.5 + 0.01 * (step % 3)})
    costs = {"step_signals": timed(lambda: step_signals(groups), repeat)}
    for rule in default_rules(HealthConfig(), max_staleness=1):
        costs[f"rule {rule.name}"] = timed(lambda r=rule: r.check(watch.history), repeat * 20)
    costs["HealthWatch.observe (all rules)"] = timed(
        lambda: watch.observe(steps + 1, row), repeat * 20
    )
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="rows already in the history")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    costs = measure(args.steps, args.repeat)
    total = costs["step_signals"] + costs["HealthWatch.observe (all rules)"]
    rows = [(name, f"{s * 1e6:,.0f}", f"{s / DEMO_STEP_S:.5%}") for name, s in costs.items()]
    rows.append(("total (signals + observe)", f"{total * 1e6:,.0f}", f"{total / DEMO_STEP_S:.4%}"))
    markdown = table(("part", "us per step", f"of a {DEMO_STEP_S:.1f} s demo step"), rows)
    print(markdown)
    results = {
        "costs_s": costs,
        "total_s": total,
        "demo_step_s": DEMO_STEP_S,
        "share_of_step": total / DEMO_STEP_S,
    }
    settings = {
        "steps_in_history": args.steps,
        "repeat": args.repeat,
        "groups": 16,
        "group_size": 8,
    }
    print(f"wrote {save('health', settings, results, markdown)}")


if __name__ == "__main__":
    main()

"""The CPU trainer step of the calculator demo: one core (vLLM's left alone) against
every core (``trainer.borrow_idle_cores``, while no episode is being generated).

    python benchmarks/bench_cpu_trainer.py [--reps 3] [--groups 16]

Builds the demo's tiny model and a step's worth of calculator-shaped trajectories
(16 groups of 8, a 150-token prompt and three short sampled and rendered turns, as the
demo's episodes are), then times ``Trainer.train_step`` alternately with the trainer
pinned to one core and with every core lent to it, in the same process. Prints the
seconds per step and the ratio; writes ``results/cpu_trainer.json``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import save, table, timed


def _trajectory(rng: np.random.Generator, task: int, index: int, vocab: int) -> object:
    from agentrl.types import TokenSpan, Trajectory

    spans, ids, logprobs, versions, mask = [], [], [], [], []

    def add(kind: str, n: int, turn: int) -> None:
        start = len(ids)
        ids.extend(rng.integers(5, vocab, n).tolist())
        sampled = kind == "assistant"
        logprobs.extend(rng.uniform(-2.0, -0.01, n).tolist() if sampled else [math.nan] * n)
        versions.extend([0] * n if sampled else [-1] * n)
        mask.extend([1 if sampled else 0] * n)
        spans.append(TokenSpan(kind, start, start + n, turn))  # type: ignore[arg-type]

    add("prompt", 150, 0)
    add("assistant", 24, 0)
    add("env", 16, 1)
    add("assistant", 8, 1)
    reward = float(rng.random() < 0.5)
    return Trajectory(
        episode_id=f"t{task}/{index}",
        task_id=f"t{task}",
        env_id="bench",
        seed=task,
        token_ids=ids,
        logprobs=logprobs,
        versions=versions,
        loss_mask=mask,
        spans=tuple(spans),
        messages=[],
        turn_rewards=[reward],
        reward=reward,
        status="finished",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--groups", type=int, default=16)
    args = parser.parse_args()

    import os

    from agentrl.config.sections import TrainerConfig
    from agentrl.models.tiny import build_tiny_model
    from agentrl.trainer.trainer import Trainer
    from agentrl.types import Group, Task
    from examples.calculator_agent.run import DEMO_MODEL

    cores = len(os.sched_getaffinity(0))
    model = build_tiny_model(DEMO_MODEL)
    trainer = Trainer(str(model), TrainerConfig(lr=1e-4), temperature=1.0, seed=0)
    rng = np.random.default_rng(0)
    vocab = trainer.model.get_input_embeddings().num_embeddings
    groups = [
        Group(Task(f"t{g}", "bench", g), 8, [_trajectory(rng, g, i, vocab) for i in range(8)])
        for g in range(args.groups)
    ]
    tokens = sum(len(t.token_ids) for g in groups for t in g.trajectories)
    times: dict[str, list[float]] = {"one core": [], "every core": []}
    trainer.pin()
    trainer.train_step(groups)  # warm-up
    for _ in range(args.reps):
        for name, lend in (("one core", None), ("every core", lambda: True)):
            trainer.lend_cores = lend
            trainer.pin()
            times[name].append(timed(lambda: trainer.train_step(groups))[0])
    one, every = statistics.median(times["one core"]), statistics.median(times["every core"])
    rows = [
        [name, statistics.median(v), tokens / statistics.median(v)] for name, v in times.items()
    ]
    markdown = (
        f"calculator-demo train step ({args.groups} groups x 8, {tokens} tokens), "
        f"{cores} cores, median of {args.reps}:\n\n"
        + table(["trainer", "s/step", "tokens/s"], rows)
        + f"\n\nevery core / one core speed: {one / every:.2f}x"
    )
    print(markdown)
    save(
        "cpu_trainer",
        {"groups": args.groups, "reps": args.reps, "cores": cores},
        {"tokens": tokens, "seconds": times, "speedup": one / every},
        markdown,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

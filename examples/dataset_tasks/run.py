"""Tasks from a dataset, end to end: write the JSONL, evaluate, train, evaluate again.

    python examples/dataset_tasks/run.py [--model MODEL] [--out runs/dataset-tasks]
        [--tasks 50] [agentrl train overrides, e.g. --train.steps=60]

1. ``make_data.py`` writes arithmetic word problems to ``data/train.jsonl`` and
   ``data/test.jsonl``.
2. ``agentrl eval MODEL`` on the test split: pass@1, pass@4 and avg@4 before training.
3. ``agentrl train config.toml``: the rows of the train split through
   ``agentrl/Dataset-v0`` with the calculator tool, scored by ``rewards.py:exact``.
4. ``agentrl eval RUN_DIR`` (the trained model, the run's settings) on the test split.

MODEL should already follow the ``Answer: N`` format (e.g. the warm-started model of
examples/calculator_agent); the untrained tiny model scores 0 and learns little.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from make_data import write  # noqa: E402

AGENTRL = [sys.executable, "-m", "agentrl.cli"]
TEST = ['--env.kwargs.split="test"']


def agentrl(*args: str) -> None:
    print("$ agentrl " + " ".join(args), flush=True)
    subprocess.run([*AGENTRL, *args], cwd=ROOT, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--out", default="runs/dataset-tasks")
    parser.add_argument("--tasks", type=int, default=50, help="held-out tasks evaluated")
    args, overrides = parser.parse_known_args()
    write(HERE / "data")
    config = str(HERE / "config.toml")
    evaluate = ["--episodes", str(args.tasks), "-k", "4", "--temperature", "1.0", *TEST]
    agentrl("eval", args.model, "--config", config, *evaluate, "--out", f"{args.out}-eval-before")
    agentrl("train", config, f"--model.path={args.model!r}", f"--run.out={args.out!r}",
            *overrides)  # fmt: skip
    agentrl("eval", args.out, *evaluate, "--out", f"{args.out}-eval-after")


if __name__ == "__main__":
    main()

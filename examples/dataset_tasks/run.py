"""Tasks from a dataset, end to end: write the JSONL, evaluate, train, evaluate again.

    python examples/dataset_tasks/run.py [--model demo|MODEL] [--no-warm-start]
        [--out runs/dataset-tasks] [--tasks 50] [agentrl train overrides, e.g. --train.steps=60]

1. ``make_data.py`` writes arithmetic word problems to ``data/train.jsonl`` and
   ``data/test.jsonl`` (no test question in train).
2. The model: the calculator demo's warm-started model (``make demo`` caches it; built
   here otherwise), then a short SFT on word-problem demonstrations from the train split
   (``warm_start.py``; 40 % call the tool, the rest guess), cached.
3. ``agentrl eval MODEL`` on the test split: pass@1, pass@4 and avg@4 before training.
4. ``agentrl train config.toml``: the rows of the train split through
   ``agentrl/Dataset-v0`` with the calculator tool, scored by ``rewards.py:exact``.
5. ``agentrl eval RUN_DIR`` (the trained model, the run's settings) on the test split.

MODEL should already follow the tool format and ``Answer: N`` (the calculator demo's
model does); without the word-problem warm start it scores about 0 and RL has nothing to
reinforce.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(ROOT))  # examples.calculator_agent, tools

from make_data import write  # noqa: E402

AGENTRL = [sys.executable, "-m", "agentrl.cli"]
TEST = ['--env.kwargs.split="test"']


def agentrl(*args: str) -> None:
    print("$ agentrl " + " ".join(args), flush=True)
    subprocess.run([*AGENTRL, *args], cwd=ROOT, check=True)


def model_to_train(model: str, warm: bool) -> str:
    """``demo``: the calculator demo's warm-started tiny model (built, or reused from
    ``make demo``'s cache); then, unless ``warm`` is off, its word-problem warm start."""
    if model == "demo":
        from examples.calculator_agent.run import RECIPE
        from examples.calculator_agent.run import warm_start as calculator_warm_start

        model = str(calculator_warm_start("tiny", False, RECIPE))
    if not warm:
        return model
    import tomllib

    from warm_start import warm_start

    kwargs = tomllib.loads((HERE / "config.toml").read_text())["env"]["kwargs"]
    return str(warm_start(Path(model), HERE / "data", kwargs["system_prompt"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        default="demo",
        help="'demo' (the calculator demo's warm-started model) or a model path",
    )
    parser.add_argument(
        "--no-warm-start",
        action="store_true",
        help="train MODEL as it is (no SFT on the word problems first)",
    )
    parser.add_argument("--out", default="runs/dataset-tasks")
    parser.add_argument("--tasks", type=int, default=50, help="held-out tasks evaluated")
    args, overrides = parser.parse_known_args()
    write(HERE / "data")
    args.model = model_to_train(args.model, not args.no_warm_start)
    config = str(HERE / "config.toml")
    evaluate = ["--episodes", str(args.tasks), "-k", "4", "--temperature", "1.0", *TEST]
    agentrl("eval", args.model, "--config", config, *evaluate, "--out", f"{args.out}-eval-before")
    agentrl("train", config, f"--model.path={args.model!r}", f"--run.out={args.out!r}", *overrides)
    agentrl("eval", args.out, *evaluate, "--out", f"{args.out}-eval-after")


if __name__ == "__main__":
    main()

"""A multi-turn demo that learns: guess the number, with SFT then async RL.

    python examples/guess_number/run.py                      # CPU, the tiny model
    python examples/guess_number/run.py --trainer.loss.advantage=episode   # plain GRPO

Each episode is a conversation: the agent guesses a number from 1 to 30, the env
answers "Higher." or "Lower.", and the reward is 1 for finding it within 8 guesses.

1. Build the calculator demo's tiny model (every 1-3 digit chunk is one token).
2. Warm it up with a short SFT (TRL's SFTTrainer) on noisy-bisection demonstrations
   (see demonstrations.py): each turn writes the interval still open and a guess a
   fifth of the way into it. The warm-started model is cached (``--fresh-sft``
   rebuilds it).
3. ``agentrl train config.toml`` with it: async GRPO over whole conversations with
   per-turn credit (GiGPO), evaluated before and after on 1,000 episodes (seeds the
   demonstrations never used).

It prints success rate and mean turns before and after RL and writes
``RUN_DIR/plots/guess_number.png``. Everything after the script's own options goes to
``agentrl train`` as overrides (``--train.steps=24``, ``--run.out=runs/guess``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # run from a checkout without installing

from agentrl.sft import SFTSettings, scaled_stage  # noqa: E402


@dataclasses.dataclass(frozen=True)
class WarmStart:
    """The SFT recipe: one stage of (settings, number of demonstrations, noise)."""

    settings: SFTSettings = dataclasses.field(
        default_factory=lambda: SFTSettings(
            steps=240, batch_size=16, lr=2e-3, scheduler="constant_with_warmup"
        )
    )
    count: int = 3840
    centre: float = 0.2
    """Where a demonstrated guess aims, as a fraction of the open interval (0.5: bisection).
    Off-centre, so the warm start searches lopsidedly and RL has to find the middle."""
    noise: float = 0.3
    """Gaussian noise of a demonstrated guess, in half-widths of the open interval."""
    env_kwargs: tuple[tuple[str, object], ...] = (("low", 1), ("high", 30), ("max_guesses", 8))


RECIPE = WarmStart()


def scaled(recipe: WarmStart, scale: float) -> WarmStart:
    """The recipe with its steps and demonstrations times ``scale`` (for quick checks)."""
    settings, count = scaled_stage(recipe.settings, recipe.count, scale)
    return dataclasses.replace(recipe, settings=settings, count=count)


def warm_start(fresh: bool, recipe: WarmStart = RECIPE) -> Path:
    """Build (or reuse) the warm-started tiny model; return its folder."""
    from transformers import AutoTokenizer

    from agentrl.models.tiny import build_tiny_model
    from agentrl.sft import cached_warm_start, demonstration_example
    from agentrl.sft import warm_start as sft
    from examples.calculator_agent.run import DEMO_MODEL
    from examples.guess_number.demonstrations import demonstrations

    base = build_tiny_model(DEMO_MODEL)
    out, built = cached_warm_start("guess-number", recipe, DEMO_MODEL.key(), fresh)
    if built:
        print(f"warm start: reusing {out} (--fresh-sft rebuilds it)", flush=True)
        return out
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    demos = demonstrations(
        recipe.count, recipe.noise, centre=recipe.centre, **dict(recipe.env_kwargs)
    )
    examples = [demonstration_example(tokenizer, d) for d in demos]
    print(
        f"warm start: SFT of the tiny model on {len(demos)} noisy-bisection episodes, "
        f"{recipe.settings.steps} steps (TRL SFTTrainer)",
        flush=True,
    )
    started = time.perf_counter()
    sft(
        str(base),
        [(recipe.settings, examples)],
        out,
        on_log=lambda line: print(f"  {line}", flush=True),
    )
    print(f"warm start: done in {time.perf_counter() - started:.0f} s -> {out}", flush=True)
    return out


def plot(before: dict, after: dict, run_dir: Path, max_guesses: int) -> Path:
    """``plots/guess_number.png``: training success per step and the before/after bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agentrl.monitor import read_metrics

    rows = read_metrics(run_dir, "train")
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(
        [r["step"] for r in rows],
        [r.get("success_rate", float("nan")) for r in rows],
        marker=".",
        label="training episodes",
    )
    left.scatter(
        [before["step"], after["step"]],
        [before["success_rate"], after["success_rate"]],
        color="black",
        zorder=3,
        label="held-out eval",
    )
    left.set(
        xlabel="optimizer step",
        ylabel="success rate",
        ylim=(-0.02, 1.05),
        title=f"Numbers found within {max_guesses} guesses",
    )
    left.grid(alpha=0.3)
    left.legend(loc="lower right")
    labels = ("success rate", "turns / episode", "turns to solve")
    keys = ("success_rate", "turns_per_episode", "turns_to_solve")
    x = range(len(labels))
    for offset, (name, ev) in zip(
        (-0.2, 0.2), (("before RL", before), ("after RL", after)), strict=True
    ):
        values = [ev[k] for k in keys]
        bars = right.bar([i + offset for i in x], values, width=0.4, label=name)
        right.bar_label(bars, fmt="%.2f", fontsize=8)
    right.set_xticks(list(x), labels)
    right.set(title=f"Held-out evaluation ({after['episodes']} episodes)")
    right.legend()
    fig.tight_layout()
    path = run_dir / "plots" / "guess_number.png"
    path.parent.mkdir(exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report(before: dict, after: dict, temperature: float) -> None:
    print(
        f"  held-out episodes ({after['episodes']}, temperature {temperature}):"
        f"   before RL   after RL"
    )
    print(
        f"    {'success rate':<34} {before['success_rate']:>8.1%}   {after['success_rate']:>8.1%}"
    )
    for key, label in (
        ("turns_per_episode", "mean turns per episode"),
        ("turns_to_solve", "mean turns to solve (solved ones)"),
    ):
        print(f"    {label:<34} {before[key]:>8.2f}   {after[key]:>8.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fresh-sft", action="store_true", help="redo the SFT warm start")
    parser.add_argument(
        "--sft-scale",
        type=float,
        default=1.0,
        help="scale the SFT steps and data (a quick check: 0.05)",
    )
    args, overrides = parser.parse_known_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    started = time.perf_counter()
    model = warm_start(args.fresh_sft, scaled(RECIPE, args.sft_scale))

    import asyncio

    from agentrl.cli import end_quietly, quiet_vllm
    from agentrl.errors import AgentRLError
    from agentrl.run import prepare, train

    quiet_vllm()
    end_quietly()  # at exit, no teardown noise from triton after the results or an error
    try:
        config, run_dir = prepare(HERE / "config.toml", [f'--model.path="{model}"', *overrides])
        result = asyncio.run(train(config, run_dir))
    except AgentRLError as e:
        print(f"agentrl: error: {e}", file=sys.stderr)
        return 1
    before, after = result.eval_before, result.eval_after
    print(
        f"\nguess-number demo: {result.steps} RL steps, {time.perf_counter() - started:.0f} s "
        f"in all; run directory {run_dir}"
    )
    if before and after:
        report(before, after, config.eval.temperature)
        print(f"  plot: {plot(before, after, run_dir, config.env.kwargs.get('max_guesses', 0))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

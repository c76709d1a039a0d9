"""Off-policy corrections under forced staleness: success against steps, side by side.

    python benchmarks/bench_ablation.py                       # the full grid, ~1 hour on 2 cores
    python benchmarks/bench_ablation.py --tasks digits --staleness 0,4 --steps 6   # a quick look

For each task (``digits``: the tiny model from random weights learns to answer in
digits; ``guess_number``: the guess-the-number demo's warm-started model, multi-turn),
each ``rollout.max_staleness`` (0, 2, 4) and each correction (below), one real
``agentrl train`` run (in-process vLLM, its own process), same seed, same steps. The
trainer is the bottleneck on CPU, so the scheduler admits episodes as far ahead as the
bound allows and the data really is that stale: the table reports the staleness the
trainer measured (mean versions behind, over the run's trained episodes).

Corrections (:data:`CORRECTIONS`), each a set of ``[trainer.loss]`` overrides on the
task's loss:

- ``none``: no importance correction against vLLM's logprobs at all;
- ``tis``: token-level truncated importance sampling, weights in [0, 2] (the default);
- ``geo``: TIS plus Geo-RS, drop a sequence whose geometric-mean ratio leaves [0.99, 1.01];
- ``icepop``: TIS plus IcePop, drop the tokens whose ratio leaves [0.5, 2];
- ``dppo``: prime-rl's DPPO loss (its trust-region mask and squared log-ratio KL).

Writes ``benchmarks/results/ablation.{json,md,png}``: the final score (the mean of the
last three steps' training batches) and the held-out evaluation after training, per
task, staleness and correction, and the curves (success rate for guess_number, mean
reward, the share of digits, for digits). Runs keep their directories
under ``--out`` (default: a temporary folder) to inspect with ``agentrl replay``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CORRECTIONS: dict[str, list[str]] = {
    "none": ["--trainer.loss.correction=none"],
    "tis": [],
    "geo": ["--trainer.loss.geo_mask_low=0.99", "--trainer.loss.geo_mask_high=1.01"],
    "icepop": ["--trainer.loss.token_mask_low=0.5", "--trainer.loss.token_mask_high=2.0"],
    "dppo": ["--trainer.loss.kind=dppo"],
}

# Each task: (base config as TOML, steps by default, the metric). Digits' reward is the
# share of digits in the reply, so its metric is the mean reward; guess_number's is the
# success rate (found within the budget). The concurrency
# leaves room for max_staleness + 1 batches in flight and queued, so a bound of 4 is
# reached rather than capped by the concurrency.
TASKS: dict[str, tuple[str, int, str]] = {
    "digits": (
        """
[run]
name = "ablation-digits"
[model]
path = "tiny"
[env]
id = "agentrl/Digits-v0"
[rollout]
group_size = 8
concurrency = 160
max_turns = 1
max_tokens_per_turn = 16
[trainer]
lr = 3e-3
[trainer.loss]
kind = "dapo"
[train]
groups_per_step = 4
checkpoint_every = 1000
[eval]
episodes = 64
""",
        14,
        "reward_mean",
    ),
    "guess_number": (
        """
[run]
name = "ablation-guess-number"
[model]
path = "WARM_START"
[env]
id = "agentrl/GuessNumber-v0"
kwargs = { low = 1, high = 30, max_guesses = 8 }
[rollout]
group_size = 8
concurrency = 160
max_turns = 8
max_tokens_per_turn = 40
[trainer]
lr = 2e-4
[trainer.loss]
kind = "grpo"
[train]
groups_per_step = 8
checkpoint_every = 1000
[eval]
episodes = 100
success_reward = 1.0
""",
        16,
        "success_rate",
    ),
}


def run_one(
    task: str, staleness: int, correction: str, steps: int, out: Path, model: str | None, seed: int
) -> dict[str, Any]:
    """One ``agentrl train`` run in its own process; its train and eval rows."""
    base, _, metric = TASKS[task]
    run_dir = out / f"{task}-s{staleness}-{correction}"
    config = out / f"{task}.toml"
    config.write_text(base.replace("WARM_START", model or ""))
    args = [
        str(config),
        f"--run.out={run_dir}",
        f"--train.steps={steps}",
        f"--rollout.max_staleness={staleness}",
        f"--run.seed={seed}",
        *CORRECTIONS[correction],
    ]
    started = time.perf_counter()
    code = "import sys; from agentrl.cli import main; sys.exit(main(['train', *sys.argv[1:]]))"
    log = out / f"{run_dir.name}.log"
    with log.open("w") as sink:
        proc = subprocess.run(
            [sys.executable, "-c", code, *args], stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT
        )
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-15:])
        raise SystemExit(f"{run_dir.name} failed (exit {proc.returncode}); {log}:\n{tail}")
    from agentrl.monitor import read_metrics

    rows = read_metrics(run_dir, None)
    train = [r for r in rows if r.get("kind") == "train"]
    evals = {r.get("label"): r for r in rows if r.get("kind") == "eval"}
    curve = [float(r.get(metric, float("nan"))) for r in train]
    fractions = ("masked_fraction", "geo_masked_fraction", "token_masked_fraction")
    masked = {k: statistics.fmean(float(r.get(k, 0.0)) for r in train) for k in fractions}
    return {
        "task": task,
        "staleness": staleness,
        "correction": correction,
        "wall_s": wall,
        "metric": metric,
        "curve": curve,
        "final_score": statistics.fmean(curve[-3:]) if curve else float("nan"),
        "eval_before": evals.get("before", {}).get(metric),
        "eval_after": evals.get("after", {}).get(metric),
        "turns_to_solve_after": evals.get("after", {}).get("turns_to_solve"),
        "staleness_mean": statistics.fmean(float(r["staleness_mean"]) for r in train[1:])
        if len(train) > 1
        else 0.0,
        "masked": masked,
        "run_dir": str(run_dir),
    }


def markdown(results: list[dict[str, Any]], corrections: list[str]) -> str:
    from benchmarks.common import table

    parts = [
        "### Off-policy corrections under forced staleness (tiny model, CPU)",
        "",
        "Each cell: the held-out score after training, then (in brackets) the mean "
        "training-batch score over all the run's steps, which also rewards learning "
        "early. Score: success rate for guess_number, mean reward (share of digits) "
        "for digits. Row label: the bound, then the staleness the trainer measured "
        "(mean versions behind).",
    ]
    for task in dict.fromkeys(r["task"] for r in results):
        rows = []
        for s in sorted({r["staleness"] for r in results if r["task"] == task}):
            cell = {r["correction"]: r for r in results if (r["task"], r["staleness"]) == (task, s)}
            measured = statistics.fmean(r["staleness_mean"] for r in cell.values())
            rows.append(
                [f"max_staleness {s} ({measured:.2f})"]
                + [
                    f"{cell[c]['eval_after']:.2f} ({statistics.fmean(cell[c]['curve']):.2f})"
                    if c in cell and cell[c]["eval_after"] is not None
                    else "-"
                    for c in corrections
                ]
            )
        mean_row = ["mean over staleness"]
        for c in corrections:
            got = [
                r["eval_after"]
                for r in results
                if (r["task"], r["correction"]) == (task, c) and r["eval_after"] is not None
            ]
            mean_row.append(f"**{statistics.fmean(got):.3f}**" if got else "-")
        rows.append(mean_row)
        before = next((r["eval_before"] for r in results if r["task"] == task), None)
        parts += [
            "",
            f"**{task}** (held-out score before training: {before:.2f})"
            if before is not None
            else f"**{task}**",
            "",
            table(["", *corrections], rows),
        ]
    return "\n".join(parts)


def plot(results: list[dict[str, Any]], corrections: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r["task"] for r in results))
    stales = sorted({r["staleness"] for r in results})
    fig, axes = plt.subplots(
        len(tasks),
        len(stales),
        figsize=(4 * len(stales), 3.2 * len(tasks)),
        squeeze=False,
        sharey=True,
    )
    for i, task in enumerate(tasks):
        for j, s in enumerate(stales):
            ax = axes[i][j]
            for c in corrections:
                for r in results:
                    if (r["task"], r["staleness"], r["correction"]) == (task, s, c):
                        ax.plot(range(1, len(r["curve"]) + 1), r["curve"], label=c)
            ax.set(title=f"{task}, max_staleness {s}", xlabel="step", ylim=(-0.02, 1.05))
            ax.grid(alpha=0.3)
            if j == 0:
                ax.set_ylabel(TASKS[task][2].replace("_", " "))
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="digits,guess_number")
    parser.add_argument("--staleness", default="0,2,4")
    parser.add_argument("--corrections", default=",".join(CORRECTIONS))
    parser.add_argument("--steps", type=int, default=None, help="per run (default: per task)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here")
    parser.add_argument(
        "--report",
        type=Path,
        default=None,
        metavar="ABLATION.json",
        help="run nothing: redraw the table and plot from a result",
    )
    args = parser.parse_args()
    if args.report is not None:
        saved = json.loads(args.report.read_text())
        results, corrections = saved["results"], saved["settings"]["corrections"]
        from benchmarks.common import RESULTS

        plot(results, corrections, RESULTS / "ablation.png")
        print(markdown(results, corrections))
        return 0
    tasks = [t for t in args.tasks.split(",") if t]
    corrections = [c for c in args.corrections.split(",") if c]
    stales = [int(s) for s in args.staleness.split(",") if s]
    for name, known in (("task", TASKS), ("correction", CORRECTIONS)):
        for value in tasks if name == "task" else corrections:
            if value not in known:
                parser.error(f"unknown {name} {value!r}; choose from {', '.join(known)}")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    model = None
    if "guess_number" in tasks:
        from examples.guess_number.run import warm_start

        model = str(warm_start(fresh=False))
    out = args.out or Path(tempfile.mkdtemp(prefix="agentrl-ablation-"))
    out.mkdir(parents=True, exist_ok=True)
    grid = [(t, s, c) for t in tasks for s in stales for c in corrections]
    results, started = [], time.perf_counter()
    for n, (task, s, c) in enumerate(grid, 1):
        steps = args.steps or TASKS[task][1]
        r = run_one(task, s, c, steps, out, model, args.seed)
        results.append(r)
        so_far = time.perf_counter() - started
        print(
            f"  [{n}/{len(grid)}] {task:<12} max_staleness {s}  {c:<6}  eval "
            f"{r['eval_before']:.2f} -> {r['eval_after']:.2f}  final batch "
            f"{r['final_score']:.2f}  staleness {r['staleness_mean']:.2f}  "
            f"{r['wall_s']:.0f} s  ({so_far:.0f} s so far)",
            flush=True,
        )
    from benchmarks.common import RESULTS, save

    md = markdown(results, corrections)
    RESULTS.mkdir(exist_ok=True)
    png = RESULTS / "ablation.png"
    plot(results, corrections, png)
    total = time.perf_counter() - started
    md += f"\n\n{len(grid)} runs, {total:.0f} s in all; curves: `{png.name}`."
    settings = {
        "tasks": tasks,
        "staleness": stales,
        "corrections": corrections,
        "steps": args.steps,
        "seed": args.seed,
        "overrides": CORRECTIONS,
    }
    save("ablation", settings, results, md, markdown_file=True)
    print(md)
    print(json.dumps({"plot": str(png)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

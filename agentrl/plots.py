"""PNG plots of a run from its ``metrics.jsonl``: reward, staleness, throughput, eval.

``eval.png`` (only when the run evaluated) draws the held-out success rate and pass@k
of every evaluation at the step it started after: before (step 0), every
``eval.every`` steps, after (the last step); :func:`eval_series` is its data.

agentrl plot RUN_DIR        # also written at the end of every `agentrl train`
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.monitor import read_metrics

logger = logging.getLogger(__name__)


def eval_series(evals: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """The curves of ``eval.png`` from the eval rows: success rate, then each pass@j
    (j > 1), as (step, value) points in step order."""
    curves: dict[str, list[tuple[int, float]]] = {"success rate": []}
    for ev in sorted(evals, key=lambda e: int(e["step"])):
        curves["success rate"].append((int(ev["step"]), float(ev.get("success_rate", "nan"))))
        for key, value in ev.items():
            if key.startswith("pass@") and key != "pass@1":
                curves.setdefault(key, []).append((int(ev["step"]), float(value)))
    return curves


def write_plots_at_end(run_dir: str | Path) -> list[Path]:
    """:func:`write_plots` as the end of a run calls it: a failure (matplotlib missing or
    broken, a full disk) is logged, not raised, since the run's data is written already."""
    try:
        return write_plots(run_dir)
    except Exception:
        logger.warning("the plots of %s were not written", run_dir, exc_info=True)
        return []


def write_plots(run_dir: str | Path) -> list[Path]:
    """Write ``plots/{reward,staleness,throughput}.png``; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    rows = read_metrics(run_dir, "train")
    evals = read_metrics(run_dir, "eval")
    if not rows:
        return []
    out = run_dir / "plots"
    out.mkdir(exist_ok=True)
    steps = [r["step"] for r in rows]

    def series(name: str) -> list[float]:
        return [float(r.get(name, float("nan"))) for r in rows]

    written = []

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, series("reward_mean"), label="reward (mean)")
    ax.plot(steps, series("success_rate"), label="success rate")
    ax.plot(steps, series("tool_use_rate"), label="tool-use rate", linestyle="--")
    for ev in evals:
        ax.scatter(
            [ev["step"]],
            [ev.get("success_rate", float("nan"))],
            marker="o",
            s=50,
            color="black",
            zorder=3,
        )
        ax.annotate(
            f"eval {ev.get('success_rate', 0):.0%}",
            (ev["step"], ev["success_rate"]),
            textcoords="offset points",
            xytext=(4, -12),
            fontsize=8,
        )
    ax.set(
        xlabel="optimizer step",
        ylabel="rate",
        title="Reward and success (training episodes)",
        ylim=(-0.02, 1.05),
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    written.append(_save(fig, out / "reward.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, series("staleness_mean"), label="mean")
    ax.plot(steps, series("staleness_max"), label="max", linestyle="--")
    ax.set(
        xlabel="optimizer step",
        ylabel="versions behind the trainer",
        title="Token staleness at training time",
    )
    ax.grid(alpha=0.3)
    ax.legend()
    written.append(_save(fig, out / "staleness.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, series("tokens_per_s"), label="sampled tokens/s")
    ax.plot(steps, series("trained_tokens_per_s"), label="trained tokens/s", linestyle="--")
    ax.set(xlabel="optimizer step", ylabel="tokens per second", title="Throughput")
    ax.grid(alpha=0.3)
    ax.legend()
    written.append(_save(fig, out / "throughput.png"))
    if evals:
        written.append(_plot_evals(plt, evals, out / "eval.png"))
    plt.close("all")
    return written


def _plot_evals(plt: Any, evals: Sequence[Mapping[str, Any]], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, points in eval_series(evals).items():
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    for ev in evals:
        if ev.get("label") in ("before", "after"):
            ax.annotate(
                ev["label"],
                (ev["step"], ev.get("success_rate", 0)),
                textcoords="offset points",
                xytext=(4, 6),
                fontsize=8,
            )
    episodes = evals[-1].get("episodes", "?")
    ax.set(
        xlabel="optimizer step",
        ylabel="rate",
        ylim=(-0.02, 1.05),
        title=f"Held-out evaluation ({episodes} episodes each)",
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path

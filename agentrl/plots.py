"""PNG plots of a run from its ``metrics.jsonl``: reward, staleness, throughput.

agentrl plot RUN_DIR        # also written at the end of every `agentrl train`
"""

from __future__ import annotations

from pathlib import Path

from agentrl.monitor import read_metrics


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
        ax.scatter([ev["step"]], [ev.get("success_rate", float("nan"))], marker="o", s=50,
                   color="black", zorder=3)  # fmt: skip
        ax.annotate(f"eval {ev.get('success_rate', 0):.0%}", (ev["step"], ev["success_rate"]),
                    textcoords="offset points", xytext=(4, -12), fontsize=8)  # fmt: skip
    ax.set(xlabel="optimizer step", ylabel="rate", title="Reward and success (training episodes)",
           ylim=(-0.02, 1.05))  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    written.append(_save(fig, out / "reward.png"))

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, series("staleness_mean"), label="mean")
    ax.plot(steps, series("staleness_max"), label="max", linestyle="--")
    ax.set(xlabel="optimizer step", ylabel="versions behind the trainer",
           title="Token staleness at training time")  # fmt: skip
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
    plt.close("all")
    return written


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path

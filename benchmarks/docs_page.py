"""The docs site's benchmarks page, generated from ``benchmarks/results/*.json``.

    python benchmarks/docs_page.py              # print the page (Markdown)
    python benchmarks/docs_page.py --write PATH # write it (make bench writes the report)

One section per result file: what was measured and how (the benchmark script's own
summary and the settings it ran with), the machine, the commit and the date, then the
tables the benchmark wrote. Nothing here is typed by hand: a figure that is not in a
result file is not on the page. ``scripts/gen_ref_pages.py`` puts this page into the
site at build time; ``benchmarks/run_all.py`` (``make bench``) writes it after a run.
Reads JSON only (no agentrl import), so building the docs never starts an engine.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

INTRO = """\
# Benchmarks

Every figure on this page comes from a file in `benchmarks/results/` and says the
machine, the commit and the date it was measured on; `make bench` runs the benchmarks
again and regenerates this page (`python benchmarks/docs_page.py`). Figures that are
compared were measured side by side in one run, one after the other, so a noisy machine
moves both: compare ratios within a table, not figures across tables or machines. The
2-core CPU machines these ran on have measured up to 1.6x apart from one session to the
next.
"""

PEERS = {
    "demo": "None we found: peers publish GPU throughput, not the wall time from a fresh "
    "clone to a first learning curve on a fixed machine.",
    "overhead": "The peer is raw vLLM itself: the same token workload through `AsyncLLM` "
    "with nothing around it, measured in the same run.",
    "trainer": "MFU is against the bf16 (GPU) or fp32 (CPU) matmul peak measured on the "
    "same machine in the same run, not a datasheet figure.",
}
"""What a peer publishes for the same measure, where one does (by benchmark name prefix)."""


READING = {
    "async_vs_sync": "On two cores async gains less than the overlap allows: generation slows "
    "once the trainer runs beside it (vLLM's engine, the event loop and the trainer thread "
    "share the cores). With the engine on its own device, max(generation, training) is the "
    "bound async approaches.",
    "overhead": "The paired ratio is each round's platform figure over the raw figure of the "
    "same round (run back to back), with a 95% bootstrap interval; where the interval spans "
    "the 0.95 target, that run cannot say which side it is on. The platform's figure "
    "includes durable checkpoints and the chat-template rendering of every env reply.",
    "concurrency": "Throughput rises until the engine saturates (`max_num_seqs`, 256); the "
    "loop lag p99 is the figure that says whether one event loop keeps up with thousands "
    "of episodes (target: under 50 ms at 4096).",
    "ceiling": "An engine that answers at once: the most turns per second the rollout loop "
    "itself can feed, on one loop and through worker processes. Compare the rows of one "
    "run; these machines move by a third from run to run.",
    "weight_update": "`resume` loses nothing: every sampled token is in a trajectory. The "
    "maximum at 1 in flight is the first reload after the engine started.",
}
"""How to read a result (by benchmark name prefix): what the table cannot say by itself."""


def _script(benchmark: str) -> Path | None:
    """The script that writes a result: the longest ``bench_*.py`` name its name starts with."""
    names = sorted((p.stem.removeprefix("bench_") for p in HERE.glob("bench_*.py")), key=len)
    match = [n for n in names if benchmark == n or benchmark.startswith(n + "_")]
    return HERE / f"bench_{match[-1]}.py" if match else None


def _summary(script: Path | None) -> str:
    """The first sentence block of a script's docstring (what it measures)."""
    if script is None or not script.is_file():
        return ""
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    return " ".join(doc.split("\n\n")[0].split())


def _machine(m: dict[str, Any]) -> str:
    parts = [f"{m.get('cores', '?')} cores, {m.get('cpu', '?')}"]
    if m.get("memory_gib"):
        parts.append(f"{m['memory_gib']} GiB")
    parts.append(f"GPU: {m['gpu']}" if m.get("gpu") else "no GPU")
    versions = [f"{k} {m[k]}" for k in ("torch", "vllm", "transformers") if m.get(k)]
    return "; ".join(parts) + (f" ({', '.join(versions)})" if versions else "")


def _body(markdown: str) -> tuple[str, str]:
    """Split a result's Markdown into its title and its body (headings demoted)."""
    lines = markdown.strip().splitlines()
    title = ""
    if lines and lines[0].startswith("#"):
        title = lines.pop(0).lstrip("#").strip()
    body = [re.sub(r"^#+ ", "#### ", line) for line in lines]
    return title, "\n".join(body).strip()


def section(name: str, result: dict[str, Any]) -> str:
    """One result file as a page section: title, method, machine, commit, date, tables."""
    title, body = _body(result.get("markdown", ""))
    script = _script(result.get("benchmark", name))
    machine = result.get("machine", {})
    settings = json.dumps(result.get("settings", {}), separators=(", ", ": "))
    rows = [
        ("result file", f"`benchmarks/results/{name}.json`"),
        ("method", _summary(script) or result.get("method", "")),
        ("command", f"`python benchmarks/{script.name}`" if script else result.get("command", "")),
        ("settings", f"`{settings}`"),
        ("machine", _machine(machine)),
        ("commit", f"`{machine.get('agentrl_commit') or 'not recorded'}`"),
        ("date", str(result.get("when", "not recorded"))),
    ]
    peer = next((text for key, text in PEERS.items() if name.startswith(key)), "")
    if peer:
        rows.append(("peers", peer))
    reading = next((text for key, text in READING.items() if name.startswith(key)), "")
    if reading:
        rows.append(("how to read it", reading))
    if result.get("source"):
        rows.append(("how it was taken", result["source"]))
    table = ["| | |", "|---|---|", *(f"| {k} | {v.replace('|', '/')} |" for k, v in rows if v)]
    return "\n".join([f"## {title or name}", "", *table, "", body, ""])


def page(results: Path = RESULTS) -> str:
    """The whole page: the intro, then every result file in name order (demos first)."""
    files = sorted(results.glob("*.json"), key=lambda p: (not p.stem.startswith("demo"), p.stem))
    parts = [INTRO]
    for path in files:
        parts.append(section(path.stem, json.loads(path.read_text())))
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", metavar="PATH", help="write the page there instead of printing")
    args = parser.parse_args(argv)
    text = page()
    if args.write:
        Path(args.write).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

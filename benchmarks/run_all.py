"""`make bench`: every benchmark, each in its own process, then one Markdown report.

    python benchmarks/run_all.py

On 2 CPU cores: about 20 minutes, plus the trainer benchmark: a few minutes where the
CPU computes bf16 natively (AMX, AVX-512 BF16), 30 where it does not (AVX2 only: its
bf16 modes are emulated, 40-70 s a step against 3 s in fp32; 49 minutes in all).

Writes ``benchmarks/results/*.json`` (one per benchmark: machine, versions, settings,
figures) and ``benchmarks/results/report.md``: the docs site's benchmarks page
(``benchmarks/docs_page.py``: every result with its method, machine, commit and date),
which it also prints. ``make docs`` builds the same page into the site.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

BENCHMARKS = [
    ("async_vs_sync", "bench_async_vs_sync.py", []),
    ("overhead", "bench_overhead.py", ["--rounds", "11"]),  # enough for a paired interval
    ("serve_stream", "bench_serve_stream.py", []),
    ("concurrency", "bench_concurrency.py", []),
    ("weight_update", "bench_weight_update.py", []),
    ("cpu_trainer", "bench_cpu_trainer.py", []),
    ("trainer", "bench_trainer.py", ["--device", "cpu"]),
    ("sandbox", "bench_sandbox.py", []),
    ("remote_env", "bench_remote_env.py", []),
    ("ceiling", "bench_ceiling.py", []),
    ("view", "bench_view.py", []),
]


def progress_lines(text: str) -> list[str]:
    """The scripts' progress lines (indented two spaces), without the source lines Python
    prints under a library's warning."""
    lines, previous = [], ""
    for line in text.splitlines():
        if line.startswith("  ") and not re.search(r":\d+: \w+Warning: ", previous):
            lines.append(line)
        previous = line
    return lines


def main() -> int:
    from benchmarks.common import RESULTS
    from benchmarks.docs_page import page

    started = time.perf_counter()
    RESULTS.mkdir(exist_ok=True)
    failed = []
    for name, script, extra in BENCHMARKS:
        print(f"== {name} ({time.perf_counter() - started:.0f} s so far)", flush=True)
        log = RESULTS / f"{name}.log"
        with log.open("w") as out:
            proc = subprocess.run(
                [sys.executable, str(HERE / script), *extra],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=HERE.parent,
            )
        for line in progress_lines(log.read_text()):
            print(line, flush=True)
        if proc.returncode != 0:
            failed.append(name)
            print(f"   FAILED (exit {proc.returncode}); see {log}", flush=True)
    print(f"== all done in {time.perf_counter() - started:.0f} s", flush=True)
    # The docs site's benchmarks page, from every result file (this run's and older ones).
    report = page()
    (RESULTS / "report.md").write_text(report)
    print("\n" + report, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""`make bench`: every benchmark, each in its own process, then one Markdown report.

    python benchmarks/run_all.py            # about 10 minutes on 2 CPU cores

Writes ``benchmarks/results/*.json`` (one per benchmark: machine, versions, settings,
figures) and ``benchmarks/results/report.md`` (all tables), and prints the report.
"""

from __future__ import annotations

import json
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


def main() -> int:
    from benchmarks.common import RESULTS, machine

    started = time.perf_counter()
    RESULTS.mkdir(exist_ok=True)
    failed = []
    for name, script, extra in BENCHMARKS:
        print(f"== {name} ({time.perf_counter() - started:.0f} s so far)", flush=True)
        log = RESULTS / f"{name}.log"
        with log.open("w") as out:
            proc = subprocess.run([sys.executable, str(HERE / script), *extra], stdout=out,
                                  stderr=subprocess.STDOUT, cwd=HERE.parent)  # fmt: skip
        for line in log.read_text().splitlines():
            if line.startswith("  "):  # the scripts' progress lines
                print(line, flush=True)
        if proc.returncode != 0:
            failed.append(name)
            print(f"   FAILED (exit {proc.returncode}); see {log}", flush=True)
    info = machine()
    parts = [f"## Benchmarks ({time.strftime('%Y-%m-%d')}, {info['cores']} cores: {info['cpu']}; "
             f"torch {info['torch']}, vllm {info['vllm']}; commit {info['agentrl_commit']})",
             "", "Command: `make bench` (`python benchmarks/run_all.py`), "
             f"{time.perf_counter() - started:.0f} s in all."]  # fmt: skip
    for name, _, _ in BENCHMARKS:
        path = RESULTS / f"{name}.json"
        if name not in failed and path.is_file():
            parts += ["", json.loads(path.read_text())["markdown"]]
    report = "\n".join(parts) + "\n"
    (RESULTS / "report.md").write_text(report)
    print("\n" + report, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

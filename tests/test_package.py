"""The package itself: light to import, installable names present."""

from __future__ import annotations

import json
import subprocess
import sys
import time


def test_import_is_light() -> None:
    code = (
        "import json, sys, time\n"
        "t = time.perf_counter()\n"
        "import agentrl, envs, tools\n"
        "elapsed = time.perf_counter() - t\n"
        "names = ('torch', 'vllm', 'transformers', 'trl', 'peft')\n"
        "heavy = sorted(m for m in names if m in sys.modules)\n"
        "print(json.dumps({'elapsed': elapsed, 'heavy': heavy}))\n"
    )
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    report = json.loads(out.stdout)
    assert report["heavy"] == [], f"`import agentrl` imported {report['heavy']}"
    assert report["elapsed"] < 1.5, f"`import agentrl` took {report['elapsed']:.2f} s"
    assert wall < 10, f"starting python and importing agentrl took {wall:.1f} s"

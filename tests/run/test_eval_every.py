"""`agentrl train` with `eval.every` (real vLLM, tiny model, Digits): the held-out
evaluation runs before, beside training every N steps, and after, and each shows up at
its step in metrics.jsonl, TensorBoard, the eval plot and the run's lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.monitor import read_metrics, read_status
from agentrl.plots import eval_series

AGENTRL = str(Path(sys.executable).parent / "agentrl")

CONFIG = """
[run]
name = "eval-every-test"
[env]
id = "agentrl/Digits-v0"
[rollout]
group_size = 4
concurrency = 16
max_turns = 1
max_tokens_per_turn = 16
[trainer]
lr = 3e-3
[train]
steps = 4
groups_per_step = 2
checkpoint_every = 0
[eval]
episodes = 6
k = 2
every = 2
[log]
progress = "plain"
"""


@pytest.mark.vllm
@pytest.mark.timeout(300)
def test_eval_every_rows_at_their_steps(tmp_path: Path, model_cache: Path) -> None:
    run_dir, config = tmp_path / "run", tmp_path / "digits.toml"
    config.write_text(CONFIG)
    env = {**os.environ, "AGENTRL_CACHE": str(model_cache)}
    proc = subprocess.run(
        [AGENTRL, "train", str(config), f'--run.out="{run_dir}"'],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]

    evals = read_metrics(run_dir, "eval")
    assert [(e["label"], e["step"]) for e in evals] == [("before", 0), ("during", 2), ("after", 4)]
    for e in evals:
        assert (e["tasks"], e["episodes"], e["k"]) == (6, 12, 2), e
        assert 0 <= e["pass@1"] <= e["pass@2"] <= 1 and "avg@2" in e
    during = evals[1]
    assert during["version"] == 2 and during["version_last"] >= 2  # weights move under it
    assert [r["step"] for r in read_metrics(run_dir, "train")] == [1, 2, 3, 4]
    assert "eval during (step 2, version 2, 12 held-out episodes)" in output
    assert "was skipped" not in output

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("eval/success_rate")] == [0, 2, 4]
    assert [e.step for e in acc.Scalars("eval/pass@2")] == [0, 2, 4]
    assert "eval/step" not in acc.Tags()["scalars"]

    assert (run_dir / "plots" / "eval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    curves = eval_series(evals)
    assert [s for s, _ in curves["success rate"]] == [0, 2, 4]
    assert [s for s, _ in curves["pass@2"]] == [0, 2, 4]

    status = read_status(run_dir)
    assert status is not None and set(status["eval"]) == {"before", "during", "after"}
    assert status["eval"]["during"]["step"] == 2 and not status["eval_running"]

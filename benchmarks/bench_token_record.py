"""The cost of the trainer's per-token record (``trainer.record_tokens``).

    python benchmarks/bench_token_record.py [--rows 16] [--tokens 512] [--rounds 6]

One Trainer of the tiny model on CPU; optimizer steps on ``--rows`` trajectories of
``--tokens`` tokens (half of them sampled), alternately with the recorder and without
it, ``--rounds`` each; the median step time of each, the time spent in the recorder,
and the bytes the record takes per trained token. Prints a table; saves
benchmarks/results/token_record.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from agentrl.config import TrainerConfig
from agentrl.models import resolve_model
from agentrl.trainer.tokenrecord import RECORD_FILE, TokenRecorder
from agentrl.trainer.trainer import Trainer
from agentrl.types import Group, Task, TokenSpan, Trajectory
from benchmarks.common import save, table, timed


def group(rows: int, tokens: int, step: int) -> Group:
    task = Task(f"t{step}", "agentrl/Calculator-v0", step)
    half = tokens // 2
    mask = np.r_[np.zeros(half), np.ones(tokens - half)]
    trajectories = [
        Trajectory(
            episode_id=f"t{step}/{i}",
            task_id=task.task_id,
            env_id=task.env_id,
            seed=step,
            token_ids=(np.arange(tokens) * (i + 3)) % 200 + 10,
            logprobs=np.where(mask > 0, -1.0, np.nan),
            versions=np.where(mask > 0, 0, -1),
            loss_mask=mask,
            spans=(TokenSpan("prompt", 0, half, 0), TokenSpan("assistant", half, tokens, 0)),
            messages=[],
            turn_rewards=[float(i % 2)],
            reward=float(i % 2),
            status="finished",
        )
        for i in range(rows)
    ]
    return Group(task, rows, trajectories)


class TimedRecorder(TokenRecorder):
    """The recorder, timing its own work."""

    spent_s = 0.0

    def add(self, *args: Any) -> None:
        started = time.perf_counter()
        super().add(*args)
        self.spent_s += time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        recorder = TimedRecorder(Path(tmp))
        trainer = Trainer(resolve_model("tiny"), TrainerConfig(lr=1e-4), temperature=1.0, seed=0)
        times: dict[str, list[float]] = {"off": [], "on": []}
        trainer.train_step([group(args.rows, args.tokens, -1)])  # warm-up
        for r in range(2 * args.rounds):
            mode = "on" if r % 2 else "off"
            trainer.recorder = recorder if mode == "on" else None
            batch = [group(args.rows, args.tokens, r)]
            times[mode].append(timed(lambda b=batch: trainer.train_step(b))[0])
        recorder.close()
        size = (Path(tmp) / RECORD_FILE).stat().st_size
    trained = args.rounds * args.rows * (args.tokens - 1)
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    per_step = recorder.spent_s / args.rounds
    results = {
        "step_off_s": off,
        "step_on_s": on,
        "recorder_s_per_step": per_step,
        "bytes_per_token": size / trained,
    }
    markdown = table(
        [
            "step, record off",
            "step, record on",
            "in the recorder per step",
            "record bytes per token",
        ],
        [(f"{off:.3f} s", f"{on:.3f} s", f"{per_step * 1e3:.1f} ms", f"{size / trained:.1f}")],
    )
    print(markdown)
    save("token_record", vars(args), results, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())

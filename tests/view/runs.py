"""Run directories for the viewer's tests, written with the store's own API (no vLLM).

:func:`build_runs` makes ``ROOT/demo``, a finished train run of 12 episodes whose
tokens are real tokens of the tiny model's tokenizer: six tasks of two episodes, with
assistant turns sampled at versions 0, 1 and 2, tool calls and tool results, one
episode whose assistant text is ``<script>alert(1)</script>``, one crash-resumed
episode (attempt 0 failed and retried, attempt 1 finished), one fork of ``t0/0`` at
turn 1 whose turn 1 differs, and one paused (unfinished) episode; plus its
metrics.jsonl, status.json and config.toml. :class:`Built` says which is which.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.store import EpisodeStore
from agentrl.types import FailureKind, PartialEpisode, SegmentArrays, Task, TokenSpan, Trajectory

XSS = "<script>alert(1)</script>"


@dataclasses.dataclass(frozen=True)
class Built:
    root: Path
    run: Path
    xss: str = "t3/1"
    resumed: str = "t5/0"
    fork: str = "t0/0~fork@1-1"
    fork_parent: str = "t0/0"
    paused: str = "t6/0"
    versions: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    """Each finished episode's stored versions array (for the colour checks)."""


class _Tokens:
    """Builds a trajectory's parallel arrays turn by turn."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.ids: list[int] = []
        self.lp: list[float] = []
        self.v: list[int] = []
        self.mask: list[int] = []
        self.spans: list[TokenSpan] = []
        self.turn_starts: list[dict[str, int]] = []

    def add(self, kind: str, text: str, turn: int, version: int = -1) -> None:
        ids = self.tok(text, add_special_tokens=False).input_ids
        start = len(self.ids)
        sampled = kind == "assistant"
        self.ids += ids
        self.lp += [-0.1 - 0.3 * (i % 5) if sampled else float("nan") for i in range(len(ids))]
        self.v += [version if sampled else -1] * len(ids)
        self.mask += [int(sampled)] * len(ids)
        self.spans.append(TokenSpan(kind, start, len(self.ids), turn))  # type: ignore[arg-type]

    def trajectory(
        self,
        episode_id: str,
        task: Task,
        messages: list[dict[str, Any]],
        rewards: list[float],
        **kw: Any,
    ) -> Trajectory:
        return Trajectory(
            episode_id=episode_id,
            task_id=task.task_id,
            env_id=task.env_id,
            seed=task.seed,
            token_ids=np.array(self.ids),
            logprobs=np.array(self.lp),
            versions=np.array(self.v),
            loss_mask=np.array(self.mask),
            spans=tuple(self.spans),
            messages=messages,
            turn_rewards=rewards,
            reward=sum(rewards),
            turn_starts=self.turn_starts,
            env_log=_env_log(messages, task),
            **{"status": "finished", **kw},
        )


def _env_log(messages: list[dict[str, Any]], task: Task) -> list[dict[str, Any]]:
    """A reset, then one step per assistant turn, each with a state snapshot."""
    target = (task.seed or 0) + 2
    log: list[dict[str, Any]] = [{"obs": messages[:2], "state": {"target": target, "guesses": 0}}]
    answers = [m["content"] for m in messages if m["role"] == "assistant"]
    for k, answer in enumerate(answers):
        log.append(
            {
                "action": answer,
                "obs": [],
                "reward": 0.5,
                "state": {"target": target, "guesses": k + 1},
            }
        )
    return log


def _episode(
    tokenizer: Any, episode_id: str, task: Task, answers: list[str], versions: list[int], **kw: Any
) -> Trajectory:
    """An episode: a prompt, then per turn an assistant answer (turn 0 calls a tool)."""
    b = _Tokens(tokenizer)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": f"What is {task.seed} + 2?"},
    ]
    b.add("prompt", "You add numbers. What is 2 + 2?", 0)
    for turn, (answer, version) in enumerate(zip(answers, versions, strict=True)):
        b.turn_starts.append(
            {
                "messages": len(messages),
                "segment": 0,
                "tokens": len(b.ids),
                "env_steps": turn,
                "rewards": turn,
                "tool_calls": 0,
            }
        )
        b.add("assistant", answer, turn, version)
        message: dict[str, Any] = {"role": "assistant", "content": answer}
        if turn == 0:
            message["tool_calls"] = [
                {
                    "type": "function",
                    "function": {
                        "name": "calculator",
                        "arguments": {"expression": f"{task.seed}+2"},
                    },
                }
            ]
        messages.append(message)
        if turn + 1 < len(answers):
            result = f"{(task.seed or 0) + 2}"
            b.add("tool", result, turn)
            messages.append({"role": "tool", "name": "calculator", "content": result})
    return b.trajectory(episode_id, task, messages, [0.5] * len(answers), **kw)


def build_runs(root: Path, tokenizer: Any, model_path: str) -> Built:
    run = root / "demo"
    built = Built(root=root, run=run)
    config = {"run": {"name": "demo"}, "model": {"path": model_path}, "train": {"steps": 5}}
    tasks = [Task(f"t{i}", "agentrl/Calculator-v0", i) for i in range(7)]
    with EpisodeStore.open(run) as store:
        store.begin_run("train", config)
        store.add_tasks(tasks, 2)
        for i, task in enumerate(tasks[:6]):
            for j in range(2):
                eid = f"{task.task_id}/{j}"
                answers = [f"I will compute {i} plus 2.", f"The answer is {i + 2}."]
                if eid == built.xss:
                    answers = [f"Let me see {i}", XSS]
                versions = [i % 3, min(i % 3 + 1, 2)]
                if eid == built.resumed:
                    store.episode_started(eid, task, 0, 0)
                    failed = _episode(
                        tokenizer,
                        eid,
                        task,
                        ["I will"],
                        [0],
                        status="failed",
                        reason="env timed out",
                        failure=FailureKind.ENV_TIMEOUT,
                    )
                    store.save_episode([dataclasses.replace(failed, reward=0.0)], retried=True)
                    store.episode_started(eid, task, 1, 1)
                    versions = [1, 2]
                t = _episode(
                    tokenizer,
                    eid,
                    task,
                    answers,
                    versions,
                    attempt=1 if eid == built.resumed else 0,
                )
                store.episode_started(eid, task, t.attempt, versions[0])
                store.save_episode([t])
                built.versions[eid] = t.versions.tolist()
        fork = _episode(
            tokenizer,
            built.fork,
            tasks[0],
            ["I will compute 0 plus 2.", "Perhaps it is 7."],
            [0, 1],
        )
        store.save_episode([fork], origin="replay")
        paused = PartialEpisode(
            episode_id=built.paused,
            task=tasks[6],
            attempt=0,
            version=2,
            started_version=2,
            segments=[
                SegmentArrays(
                    np.array([5, 6, 7]),
                    np.array([np.nan, -0.2, -0.3]),
                    np.array([-1, 2, 2]),
                    np.array([0, 1, 1]),
                    [TokenSpan("prompt", 0, 1, 0), TokenSpan("assistant", 1, 3, 0)],
                )
            ],
            messages=[{"role": "user", "content": "What is 6 + 2?"}],
            tools=None,
            turn=0,
            turn_sampled=2,
            last_finish="stop",
            segments_started=1,
            rewards=[],
            tool_calls=0,
            env_state=None,
            env_log=[],
            turn_starts=[],
        )
        store.episode_started(built.paused, tasks[6], 0, 2)
        store.save_partials([paused])
        for step in range(3):
            store.complete_group(_group(store, tasks[step]))
            store.mark_consumed([_group(store, tasks[step])], step)
            store.record_version(step + 1, "full", "trainer")
    _trainer_record(run, built)
    now = time.time()
    with (run / "metrics.jsonl").open("w") as f:
        for step in range(5):
            f.write(
                json.dumps(
                    {
                        "kind": "train",
                        "time": now,
                        "step": step,
                        "reward_mean": 0.2 + 0.15 * step,
                        "success_rate": 0.1 * step,
                        "tool_use_rate": 0.5,
                        "staleness_mean": 0.4,
                        "tokens_per_s": 100.0 + step,
                        "wall_s": 10.0 * (step + 1),
                    }
                )
                + "\n"
            )
    (run / "status.json").write_text(
        json.dumps({"state": "finished", "pid": 0, "step": 5, "steps": 5, "time": {"wall_s": 50.0}})
    )
    (run / "config.toml").write_text('[run]\nname = "demo"\n[train]\nsteps = 5\n')
    return built


def _group(store: EpisodeStore, task: Task) -> Any:
    from agentrl.types import Group

    episodes = store.ended_episodes(task.task_id)
    return Group(task, 2, [t for ts in episodes.values() for t in ts])


def _trainer_record(run: Path, built: Built) -> None:
    """The trainer's record of ``t1/0`` at step 1: advantage 0.7, weight 1, logprob -0.5
    on every column, and the last sampled token masked by a correction."""
    from agentrl.trainer.tokenrecord import TokenRecorder

    versions = np.array(built.versions["t1/0"])
    n = len(versions)
    mask = (versions >= 0).astype(np.float32)[None, 1:]
    keep = mask.copy()
    keep[0, np.flatnonzero(mask[0])[-1]] = 0.0
    columns = np.ones((1, n - 1), dtype=np.float32)
    batch = type(
        "MicroBatch",
        (),
        {
            "keys": (("t1/0", 0, 0),),
            "advantages": 0.7 * columns,
            "mask": mask,
            "attention_mask": np.ones((1, n)),
        },
    )
    recorder = TokenRecorder(run)
    recorder.add(1, batch, -0.5 * columns, columns, keep)
    recorder.close()

"""Recorded episodes: load, select, list, show, verify, fork points, export.

Episodes are either ended (a trajectory) or unfinished (the latest checkpoint, a
:class:`~agentrl.types.PartialEpisode`).

* :func:`select`: the episodes matching the filters, loaded one at a time (constant
  memory; :func:`export` and ``agentrl export`` iterate it);
* :func:`list_episodes`: filter by state, env, reward and version span; unfinished
  episodes are marked, with the command that continues them;
* :func:`transcript`: turns, tool calls and results, env replies, rewards, and each
  sampled token's version (a ``⟨vN⟩`` marker, coloured in a terminal, wherever the
  version changes);
* :func:`verify`: rebuild the env from its seed, replay the recorded env steps and tool
  calls, and report the first observation, reward, end flag, tool result or state
  snapshot that differs;
* :func:`fork_point`: a checkpoint just before an assistant turn, with the env's state
  snapshot of that moment when it has one (:func:`restore_note` says how exact it is).

Resumed and forked episodes (:mod:`agentrl.replay.policy`) are stored as new episodes
(``origin = 'replay'``, ids ``<episode>~resumed-N`` and ``<episode>~fork@T-N``); they
are never trained.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from rich.table import Table
from rich.text import Text

from agentrl.errors import ConfigError
from agentrl.jsondata import jsonable
from agentrl.rollout.verify import VerifyResult, verify_log
from agentrl.store import EpisodeStore
from agentrl.store.pages import episode_pages
from agentrl.types import PartialEpisode, SegmentArrays, Task, Timings, Trajectory

UNFINISHED = ("running", "paused")
"""Episode states of work not ended: parked at a stop, continued by a later --resume."""

VERSION_STYLES = ("cyan", "magenta", "yellow", "green", "blue", "red")


@dataclasses.dataclass(slots=True)
class Recorded:
    """One recorded episode: its trajectory segments if it ended, else its checkpoint."""

    episode_id: str
    attempt: int
    state: str
    trajectories: list[Trajectory]
    partial: PartialEpisode | None
    stored_task: Task | None = None
    """The store's row of its task (with the env's ``kwargs`` and the reset ``options``,
    which the trajectory does not hold); None: rebuilt from the trajectory."""

    @property
    def task(self) -> Task:
        if self.partial is not None:
            return self.partial.task
        if self.stored_task is not None:
            return self.stored_task
        t = self.trajectories[0]
        return Task(t.task_id, t.env_id, t.seed if t.seed is not None else 0)

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.partial.messages if self.partial else self.trajectories[-1].messages

    @property
    def env_log(self) -> list[dict[str, Any]]:
        return self.partial.env_log if self.partial else self.trajectories[0].env_log

    @property
    def turn_rewards(self) -> list[float]:
        return self.partial.rewards if self.partial else self.trajectories[0].turn_rewards

    @property
    def turn_starts(self) -> list[dict[str, int]]:
        return self.partial.turn_starts if self.partial else self.trajectories[0].turn_starts

    def segments(self) -> list[SegmentArrays]:
        if self.partial is not None:
            return self.partial.segments
        return [
            SegmentArrays(t.token_ids, t.logprobs, t.versions, t.loss_mask, list(t.spans))
            for t in self.trajectories
        ]


def load(
    store: EpisodeStore,
    episode_id: str,
    attempt: int | None = None,
    *,
    tasks: dict[str, Task] | None = None,
) -> Recorded:
    """An episode's latest attempt (or ``attempt``): ended or checkpointed.

    ``tasks``: the store's tasks by id (read from the store when not given).
    """
    rows = [r for r in store.episodes() if r["episode_id"] == episode_id]
    if attempt is not None:
        rows = [r for r in rows if r["attempt"] == attempt]
    if not rows:
        known = [r["episode_id"] for r in store.episodes(limit=5)]
        raise ConfigError(
            f"no episode {episode_id!r}"
            + (f" (attempt {attempt})" if attempt is not None else "")
            + f" in {str(store.path)!r}; list them with `agentrl replay RUN_DIR` "
            f"(for example {known})"
        )
    row = max(rows, key=lambda r: r["attempt"])
    recorded = _recorded(store, row, tasks)
    if recorded is None:
        raise ConfigError(
            f"episode {episode_id!r} attempt {row['attempt']} is {row['state']!r} and has no "
            f"checkpoint yet (it was killed before its first turn ended); nothing to show"
        )
    return recorded


def _recorded(
    store: EpisodeStore, row: dict[str, Any], tasks: dict[str, Task] | None
) -> Recorded | None:
    """The episode attempt of an :meth:`EpisodeStore.episodes` row, with its task's
    stored row (``tasks``, read from the store when None); None when it has neither a
    trajectory nor a checkpoint (started, killed before its first turn)."""
    episode_id, attempt = row["episode_id"], row["attempt"]
    partial = store.partial(episode_id) if row["state"] in UNFINISHED else None
    if partial is not None and partial.attempt == attempt:
        return Recorded(episode_id, attempt, row["state"], [], partial)
    trajectories = store.trajectories(episode_id, attempt)
    if not trajectories:
        return None
    if tasks is None:
        tasks = {t.task_id: t for t in store.tasks()}
    task = tasks.get(trajectories[0].task_id)
    return Recorded(episode_id, attempt, row["state"], trajectories, None, task)


def select(store: EpisodeStore, **filters: Any) -> Iterator[Recorded]:
    """Every episode attempt matching ``filters`` (those of
    :meth:`EpisodeStore.episodes`), loaded one at a time in the order they started:
    constant memory over a store of any size. Attempts killed before their first
    checkpoint have nothing to load and are left out. The tasks' rows (small: env id,
    seed, kwargs, options) are read once."""
    tasks = {t.task_id: t for t in store.tasks()}
    for page in episode_pages(store, **filters):
        for row in page:
            recorded = _recorded(store, row, tasks)
            if recorded is not None:
                yield recorded


def list_episodes(store: EpisodeStore, **filters: Any) -> Table:
    """A table of episodes matching ``filters`` (see :meth:`EpisodeStore.episodes`)."""
    table = Table(title=f"episodes in {store.path}")
    for name in (
        "episode",
        "try",
        "env",
        "state",
        "reward",
        "tokens",
        "sampled",
        "versions",
        "reason",
    ):
        table.add_column(name, overflow="fold")
    unfinished = 0
    for r in store.episodes(**filters):
        span = "" if r["v_min"] is None else f"{r['v_min']}..{r['v_max']}"
        reward = "" if r["reward"] is None else f"{r['reward']:g}"
        state = r["state"]
        if state in UNFINISHED:
            unfinished += 1
            state = f"{state} (unfinished)"
        table.add_row(
            r["episode_id"],
            str(r["attempt"]),
            r["env_id"],
            state,
            reward,
            str(r["tokens"]),
            str(r["sampled"]),
            span,
            r["reason"][:60],
        )
    if unfinished:
        run_dir = store.path.parent
        table.caption = (
            f"{unfinished} unfinished episode(s): work parked when the run stopped (or still "
            f"running, if it is). `agentrl train --resume {run_dir}` (or `agentrl rollout "
            f"--resume --out {run_dir}`) continues them; `agentrl replay {run_dir} EPISODE "
            f"--resume` continues one here, as a new episode that is never trained."
        )
    return table


def transcript(recorded: Recorded, tokenizer: Any, *, from_turn: int = 0) -> Text:
    """The episode as readable text, with ``⟨vN⟩`` where the sampling version changes."""
    out = Text()
    segments = recorded.segments()
    assistant_tokens: dict[int, list[tuple[int, int]]] = {}
    for seg in segments:
        for span in seg.spans:
            if span.kind == "assistant":
                pairs = assistant_tokens.setdefault(span.turn, [])
                ids = seg.token_ids[span.start : span.end].tolist()
                pairs.extend(zip(ids, seg.versions[span.start : span.end].tolist(), strict=True))
    turn = 0
    rewards = recorded.turn_rewards
    for message in recorded.messages:
        role = message["role"]
        if role == "assistant":
            if turn >= from_turn:
                reward = f"  reward {rewards[turn]:g}" if turn < len(rewards) else ""
                out.append(f"\n[turn {turn}] assistant{reward}\n", style="bold")
                out.append_text(_versioned(assistant_tokens.get(turn, []), tokenizer))
                out.append("\n")
            turn += 1
        elif turn >= from_turn:
            name = f" {message['name']}" if role == "tool" and message.get("name") else ""
            out.append(f"\n{role}{name}:\n", style="bold dim" if role == "system" else "bold")
            out.append(str(message.get("content", "")) + "\n")
    if recorded.partial is not None:
        p = recorded.partial
        if p.turn_sampled:
            pairs = assistant_tokens.get(p.turn, [])
            out.append(
                f"\n[turn {p.turn}] assistant (unfinished, {p.turn_sampled} tokens so far)\n",
                style="bold",
            )
            out.append_text(_versioned(pairs, tokenizer))
            out.append("\n")
        out.append(f"\n-- unfinished: checkpoint at version {p.version} --\n", style="italic")
    else:
        t = recorded.trajectories[0]
        out.append(f"\n-- {t.status}: {t.reason}; reward {t.reward:g} --\n", style="italic")
    return out


def _versioned(pairs: Sequence[tuple[int, int]], tokenizer: Any) -> Text:
    text = Text()
    run: list[int] = []
    version = None
    for token, v in [*pairs, (None, None)]:
        if v != version or token is None:
            if run:
                style = VERSION_STYLES[(version or 0) % len(VERSION_STYLES)]
                text.append(f"⟨v{version}⟩", style=f"bold {style}")
                text.append(tokenizer.decode(run, skip_special_tokens=False), style=style)
            run, version = [], v
        if token is not None:
            run.append(token)
    return text


def verify(recorded: Recorded, make: Any = None) -> VerifyResult:
    """Rebuild the env from the seed, replay the recorded actions and tool calls in order,
    and compare every observation, reward, end flag, tool result and state snapshot."""
    from agentrl.env import make_env

    task = recorded.task
    env = (make or make_env)(task.env_id, **task.env_kwargs)
    return verify_log(env, task, recorded.env_log)


def fork_point(recorded: Recorded, turn: int) -> PartialEpisode:
    """A checkpoint of ``recorded`` just before assistant turn ``turn`` (env replayed)."""
    starts = recorded.turn_starts
    if not 0 <= turn < len(starts):
        raise ConfigError(
            f"--fork-at {turn}: episode {recorded.episode_id!r} has assistant turns "
            f"0..{len(starts) - 1}"
        )
    point = starts[turn]
    log = [dict(e) for e in recorded.env_log[: point["env_steps"] + 1]]
    segments = recorded.segments()
    kept = list(segments[: point["segment"]])
    last = segments[point["segment"]]
    n = point["tokens"]
    spans = [dataclasses.replace(s, end=min(s.end, n)) for s in last.spans if s.start < n]
    kept.append(
        SegmentArrays(
            last.token_ids[:n], last.logprobs[:n], last.versions[:n], last.loss_mask[:n], spans
        )
    )
    return PartialEpisode(
        episode_id=recorded.episode_id,
        task=recorded.task,
        attempt=recorded.attempt,
        version=-1,
        started_version=-1,
        segments=kept,
        messages=[dict(m) for m in recorded.messages[: point["messages"]]],
        tools=recorded.partial.tools if recorded.partial else None,
        turn=turn,
        turn_sampled=0,
        last_finish="stop",
        segments_started=point["segment"],
        rewards=list(recorded.turn_rewards[: point["rewards"]]),
        tool_calls=point["tool_calls"],
        env_state=log[-1].get("state"),  # None: the runner replays the log from the seed
        env_log=log,
        turn_starts=[dict(t) for t in starts[:turn]],
        timings=Timings(),
        info={},
    )


def restore_note(point: PartialEpisode) -> str:
    """How a fork's env is brought to the fork point, and when that is not exact."""
    steps = sum("action" in e for e in point.env_log[1:])
    calls = sum("tool" in e for e in point.env_log[1:])
    if point.env_state is not None:
        return (
            f"env restored from its state snapshot after {steps} steps and {calls} tool "
            "calls (exact)"
        )
    note = (
        f"env rebuilt by replaying {steps} steps and {calls} tool calls from seed {point.task.seed}"
    )
    if calls:
        note += (
            "; exact only if the env and its tools are deterministic and the tools "
            "have no effects outside the env (it has no get_state/set_state)"
        )
    return note


def new_episode_id(store: EpisodeStore, base: str) -> str:
    known = {r["episode_id"] for r in store.episodes()}
    n = 1
    while f"{base}-{n}" in known:
        n += 1
    return f"{base}-{n}"


def side_by_side(
    original: Recorded, fork: Recorded, turn: int, tokenizer: Any, title: str
) -> Table:
    """The two endings from ``turn`` on, in two columns."""
    table = Table(title=title, show_lines=True, expand=True)
    table.add_column(f"recorded {original.episode_id}", ratio=1, overflow="fold")
    table.add_column(f"fork {fork.episode_id}", ratio=1, overflow="fold")
    table.add_row(
        transcript(original, tokenizer, from_turn=turn), transcript(fork, tokenizer, from_turn=turn)
    )
    return table


def export(
    store: EpisodeStore,
    path: Path,
    *,
    only: Iterable[Recorded] | None = None,
    flag: str = "--out",
    **filters: Any,
) -> int:
    """Write episodes as JSONL (ended: trajectories; unfinished: checkpoints), streaming.

    ``only``: these episodes; otherwise every episode matching ``filters``. A missing
    folder of ``path`` is created; ``flag``: the option that named it, for the error.
    """
    episodes = select(store, **filters) if only is None else only
    count = 0
    with open_for_writing(path, flag) as sink:
        for recorded in episodes:
            for record in records(recorded):
                sink.write(json.dumps(record) + "\n")
            count += 1
    return count


def records(recorded: Recorded) -> Iterator[dict[str, Any]]:
    """An episode as the JSON records of :func:`export`: one per trajectory segment
    (``kind: trajectory``, :meth:`Trajectory.to_json`) or its checkpoint (``kind:
    partial``, the arrays end to end, NaN logprobs as null)."""
    if recorded.partial is not None:
        arrays = {
            k: jsonable(v, allow_nan=False) for k, v in recorded.partial.concatenated().items()
        }
        yield {"kind": "partial", **recorded.partial.meta(), **arrays}
        return
    for t in recorded.trajectories:
        yield {"kind": "trajectory", **t.to_json()}


def open_for_writing(path: Path, flag: str = "--out") -> TextIO:
    """``path`` opened for writing text, its missing folders created; a path that cannot
    be written is one :class:`ConfigError` line naming the option (``flag``), the path
    and why."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("w")
    except OSError as e:
        raise ConfigError(
            f"{flag} {str(path)!r}: cannot write there ({e.strerror or e}); "
            "choose another output path"
        ) from e

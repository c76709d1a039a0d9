"""Debug recorded episodes: list, show, verify, resume, fork, export.

Works on any run directory's episode store, while the run is going or after it ended
(or was killed). Episodes are either ended (a trajectory) or unfinished (the latest
checkpoint, a :class:`~agentrl.types.PartialEpisode`); both can be shown, verified,
exported and forked, and an unfinished one can be resumed.

* :func:`list_episodes`: filter by state, env, reward and version span;
* :func:`transcript`: turns, tool calls and results, env replies, rewards, and each
  sampled token's version (a ``⟨vN⟩`` marker, coloured in a terminal, wherever the
  version changes);
* :func:`verify`: rebuild the env from its seed, replay the recorded actions, and
  report the first observation (or reward, or end flag) that differs;
* :func:`resume_episode`: continue an unfinished episode under a model;
* :func:`fork_episode`: branch an episode at an assistant turn under another model or
  sampling setting.

Resumed and forked episodes are stored as new episodes (``origin = 'replay'``, ids
``<episode>~resumed-N`` and ``<episode>~fork@T-N``); they are never trained.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from agentrl.errors import ConfigError
from agentrl.store import EpisodeStore
from agentrl.types import PartialEpisode, SegmentArrays, Task, Timings, Trajectory

VERSION_STYLES = ("cyan", "magenta", "yellow", "green", "blue", "red")


@dataclasses.dataclass(slots=True)
class Recorded:
    """One recorded episode: its trajectory segments if it ended, else its checkpoint."""

    episode_id: str
    attempt: int
    state: str
    trajectories: list[Trajectory]
    partial: PartialEpisode | None

    @property
    def task(self) -> Task:
        if self.partial is not None:
            return self.partial.task
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


def load(store: EpisodeStore, episode_id: str, attempt: int | None = None) -> Recorded:
    """An episode's latest attempt (or ``attempt``): ended or checkpointed."""
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
    partial = store.partial(episode_id)
    if partial is not None and partial.attempt == row["attempt"]:
        return Recorded(episode_id, row["attempt"], row["state"], [], partial)
    trajectories = store.trajectories(episode_id, row["attempt"])
    if not trajectories:
        raise ConfigError(
            f"episode {episode_id!r} attempt {row['attempt']} is {row['state']!r} and has no "
            f"checkpoint yet (it was killed before its first turn ended); nothing to show"
        )
    return Recorded(episode_id, row["attempt"], row["state"], trajectories, None)


def list_episodes(store: EpisodeStore, **filters: Any) -> Table:
    """A table of episodes matching ``filters`` (see :meth:`EpisodeStore.episodes`)."""
    table = Table(title=f"episodes in {store.path}")
    for name in ("episode", "try", "env", "state", "reward", "tokens", "sampled",
                 "versions", "reason"):  # fmt: skip
        table.add_column(name, overflow="fold")
    for r in store.episodes(**filters):
        span = "" if r["v_min"] is None else f"{r['v_min']}..{r['v_max']}"
        reward = "" if r["reward"] is None else f"{r['reward']:g}"
        table.add_row(r["episode_id"], str(r["attempt"]), r["env_id"], r["state"], reward,
                      str(r["tokens"]), str(r["sampled"]), span, r["reason"][:60])  # fmt: skip
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
            out.append(f"\n[turn {p.turn}] assistant (unfinished, {p.turn_sampled} tokens so "
                       "far)\n", style="bold")  # fmt: skip
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


@dataclasses.dataclass(frozen=True, slots=True)
class VerifyResult:
    steps: int
    """Env steps replayed (the reset not counted)."""
    difference: str | None
    """The first difference, or None when every observation matched."""


def verify(recorded: Recorded, make: Any = None) -> VerifyResult:
    """Rebuild the env from the seed, replay the recorded actions, compare everything."""
    from agentrl.chat import as_messages
    from agentrl.env import make_env

    task = recorded.task
    env = (make or make_env)(task.env_id, **task.env_kwargs)
    log = recorded.env_log
    try:
        obs, _ = env.reset(seed=task.seed, options=task.options)
        if log and as_messages(obs) != log[0].get("obs"):
            return VerifyResult(0, f"reset: recorded {_short(log[0].get('obs'))}, the env now "
                                   f"says {_short(as_messages(obs))}")  # fmt: skip
        for i, entry in enumerate(log[1:], start=1):
            obs, reward, terminated, truncated, _ = env.step(entry["action"])
            now = {"obs": as_messages(obs), "reward": float(reward),
                   "terminated": bool(terminated), "truncated": bool(truncated)}  # fmt: skip
            for key, value in now.items():
                recorded_value = entry.get(key)
                if key == "reward" and recorded_value is not None:
                    same = math.isclose(float(recorded_value), value, abs_tol=1e-9)
                else:
                    same = recorded_value == value
                if not same:
                    return VerifyResult(i, f"step {i} (action {_short(entry['action'])}): "
                                           f"recorded {key} {_short(recorded_value)}, the env "
                                           f"now gives {_short(value)}")  # fmt: skip
        return VerifyResult(len(log) - 1, None)
    finally:
        env.close()


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def fork_point(recorded: Recorded, turn: int) -> PartialEpisode:
    """A checkpoint of ``recorded`` just before assistant turn ``turn`` (env replayed)."""
    starts = recorded.turn_starts
    if not 0 <= turn < len(starts):
        raise ConfigError(
            f"--fork-at {turn}: episode {recorded.episode_id!r} has assistant turns "
            f"0..{len(starts) - 1}"
        )
    point = starts[turn]
    segments = recorded.segments()
    kept = list(segments[: point["segment"]])
    last = segments[point["segment"]]
    n = point["tokens"]
    spans = [dataclasses.replace(s, end=min(s.end, n)) for s in last.spans if s.start < n]
    kept.append(SegmentArrays(last.token_ids[:n], last.logprobs[:n], last.versions[:n],
                              last.loss_mask[:n], spans))  # fmt: skip
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
        env_state=None,  # replay the actions from the seed
        env_log=[dict(e) for e in recorded.env_log[: point["env_steps"] + 1]],
        turn_starts=[dict(t) for t in starts[:turn]],
        timings=Timings(),
        info={},
    )


async def continue_episode(
    store: EpisodeStore,
    partial: PartialEpisode,
    new_id: str,
    *,
    model: str,
    temperature: float,
    max_tokens: int,
    max_turns: int,
) -> Recorded:
    """Run ``partial`` to its end under ``model``; store it as episode ``new_id``."""
    from transformers import AutoTokenizer

    from agentrl.inference import InferenceConfig, VLLMEngineClient
    from agentrl.models import resolve_model
    from agentrl.rollout import EpisodeRunner, RolloutConfig

    path = resolve_model(model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    start = dataclasses.replace(partial, episode_id=new_id, attempt=0)
    config = RolloutConfig(max_turns=max_turns, max_tokens_per_turn=max_tokens,
                           temperature=temperature)  # fmt: skip
    async with await VLLMEngineClient.start(InferenceConfig(model=path)) as client:
        trajectories = await EpisodeRunner(client, tokenizer, config).resume(start)
    store.save_episode(trajectories, origin="replay")
    return Recorded(new_id, 0, trajectories[0].status, trajectories, None)


def new_episode_id(store: EpisodeStore, base: str) -> str:
    known = {r["episode_id"] for r in store.episodes()}
    n = 1
    while f"{base}-{n}" in known:
        n += 1
    return f"{base}-{n}"


def side_by_side(original: Recorded, fork: Recorded, turn: int, tokenizer: Any,
                 title: str) -> Table:  # fmt: skip
    """The two endings from ``turn`` on, in two columns."""
    table = Table(title=title, show_lines=True, expand=True)
    table.add_column(f"recorded {original.episode_id}", ratio=1, overflow="fold")
    table.add_column(f"fork {fork.episode_id}", ratio=1, overflow="fold")
    table.add_row(transcript(original, tokenizer, from_turn=turn),
                  transcript(fork, tokenizer, from_turn=turn))  # fmt: skip
    return table


def export(
    store: EpisodeStore, path: Path, *, only: Sequence[Recorded] | None = None, **filters: Any
) -> int:
    """Write episodes as JSONL (ended: trajectories; unfinished: checkpoints).

    ``only``: these episodes; otherwise every episode matching ``filters``.
    """
    if only is None:
        only = []
        for row in store.episodes(**filters):
            try:
                only.append(load(store, row["episode_id"], row["attempt"]))
            except ConfigError:  # started, killed before its first checkpoint
                continue
    with path.open("w") as sink:
        for recorded in only:
            if recorded.partial is not None:
                arrays = {k: _jsonable(v) for k, v in recorded.partial.concatenated().items()}
                record = {"kind": "partial", **recorded.partial.meta(), **arrays}
                sink.write(json.dumps(record) + "\n")
            else:
                for t in recorded.trajectories:
                    sink.write(json.dumps({"kind": "trajectory", **t.to_json()}) + "\n")
    return len(only)


def _jsonable(array: Any) -> list[Any]:
    return [None if isinstance(x, float) and math.isnan(x) else x for x in array.tolist()]

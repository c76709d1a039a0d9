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

from agentrl.config import RunConfig
from agentrl.errors import ConfigError
from agentrl.rollout.verify import VerifyResult, verify_log
from agentrl.store import EpisodeStore
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
    unfinished = 0
    for r in store.episodes(**filters):
        span = "" if r["v_min"] is None else f"{r['v_min']}..{r['v_max']}"
        reward = "" if r["reward"] is None else f"{r['reward']:g}"
        state = r["state"]
        if state in UNFINISHED:
            unfinished += 1
            state = f"{state} (unfinished)"
        table.add_row(r["episode_id"], str(r["attempt"]), r["env_id"], state, reward,
                      str(r["tokens"]), str(r["sampled"]), span, r["reason"][:60])  # fmt: skip
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
        env_state=log[-1].get("state"),  # None: the runner replays the log from the seed
        env_log=log,
        turn_starts=[dict(t) for t in starts[:turn]],
        timings=Timings(),
        info={},
    )


@dataclasses.dataclass(frozen=True, slots=True)
class RecordedRun:
    """What a run directory recorded about itself: its config and kind (train, rollout)."""

    run_dir: Path
    config: RunConfig
    kind: str

    def tokenizer(self, model: str | None = None) -> Any:
        """The run's tokenizer (no weights loaded): ``model``'s, else the final model's
        (a train run saves it with the tokenizer), else the configured model's."""
        from transformers import AutoTokenizer

        from agentrl.models import resolve_model

        final = self.run_dir / "model"
        if model is None and (final / "tokenizer_config.json").exists():
            return AutoTokenizer.from_pretrained(final)
        return AutoTokenizer.from_pretrained(resolve_model(model or self.config.model.path))

    def policy(self, recorded: Recorded, model: str | None = None) -> Policy:
        """``model`` when given, else the policy that sampled ``recorded``."""
        if model is not None:
            return Policy(model, None, f"{model} (--model)")
        return recorded_policy(self.run_dir, self.config, self.kind, sampling_version(recorded))

    def with_sampling(self, *, temperature: float | None, max_tokens: int | None) -> RunConfig:
        """The run's config with ``--temperature`` / ``--max-tokens`` applied."""
        changes: dict[str, Any] = {}
        if temperature is not None:
            changes["temperature"] = temperature
        if max_tokens is not None:
            changes["max_tokens_per_turn"] = max_tokens
        rollout = dataclasses.replace(self.config.rollout, **changes)
        return dataclasses.replace(self.config, rollout=rollout)


def recorded_run(store: EpisodeStore, *, imports: Sequence[str] = ()) -> RecordedRun:
    """The run's recorded config and kind, with its env modules imported (the run's
    ``env.imports`` and ``imports``, e.g. ``--import``), so its env ids resolve.

    Raises:
        ConfigError: a module or file could not be imported.
    """
    from agentrl.env import import_env_modules, load_env_plugins
    from agentrl.rollout.job import recorded_config

    runs = store.runs()
    kind = runs[0]["kind"] if runs else "rollout"
    try:
        config, _ = recorded_config(store)
    except ConfigError:  # a store from an older agentrl: defaults, and its model if named
        model = runs[0]["config"].get("model") if runs else None
        config = RunConfig() if not isinstance(model, str) else RunConfig.from_dict(
            {"model": {"path": model}}
        )
    load_env_plugins()
    import_env_modules(imports, key="--import")
    import_env_modules([i for i in config.env.imports if i not in imports])
    return RecordedRun(store.path.parent, config, kind)


@dataclasses.dataclass(frozen=True, slots=True)
class Policy:
    """What samples a resumed or forked episode."""

    model: str
    """A model spec or folder vLLM loads."""
    adapter: str | None
    """A peft adapter folder served on top of ``model`` (LoRA runs), else None."""
    label: str
    """Where it came from, said in the output."""
    cleanup: str | None = None
    """A temporary folder to remove when done."""


def sampling_version(recorded: Recorded) -> int:
    """The newest policy version that sampled a token of the episode (-1: none)."""
    newest = -1
    for seg in recorded.segments():
        sampled = seg.versions[seg.versions >= 0]
        if sampled.size:
            newest = max(newest, int(sampled.max()))
    return newest


def recorded_policy(run_dir: Path, config: RunConfig, kind: str, version: int) -> Policy:
    """The policy that sampled an episode of this run, as near as the run dir keeps it.

    A rollout run: its model. A train run: the checkpoint of ``version`` when one was
    kept, else the final model, else (nothing saved yet) the base model.
    """
    base = config.model.path
    if kind != "train" or version < 0:
        return Policy(base, None, f"the run's model ({base})")
    folder = _checkpoint_of(run_dir / "checkpoints", version)
    if folder is not None:
        label = (f"checkpoint {folder.name} (version {version}, the policy that sampled this "
                 f"episode)")  # fmt: skip
        if (folder / "adapter_config.json").exists():
            return Policy(base, str(folder), label)
        return _assembled(folder, base, label)
    final = run_dir / "model"
    if final.is_dir():
        label = (f"the run's final model ({final}); no checkpoint of version {version}, which "
                 f"sampled this episode, was kept")  # fmt: skip
        if (final / "adapter_config.json").exists():
            return Policy(base, str(final), label)
        return Policy(str(final), None, label)
    return Policy(base, None, f"the run's base model ({base}); the run saved no weights yet")


def _checkpoint_of(root: Path, version: int) -> Path | None:
    for meta in sorted(root.glob("step-*/trainer.json")):
        try:
            if int(json.loads(meta.read_text())["version"]) == version:
                return meta.parent
        except (OSError, ValueError, KeyError):
            continue
    return None


def _assembled(checkpoint: Path, base: str, label: str) -> Policy:
    """A model folder vLLM loads: the base model's config and tokenizer, the weights of
    ``checkpoint`` (linked, not copied)."""
    import tempfile

    from agentrl.models import resolve_model

    source = Path(resolve_model(base))
    folder = Path(tempfile.mkdtemp(prefix="agentrl-replay-model-"))
    for item in source.iterdir():
        if item.is_file() and not item.name.endswith((".safetensors", ".bin", ".index.json")):
            (folder / item.name).symlink_to(item.resolve())
    (folder / "model.safetensors").symlink_to((checkpoint / "model.safetensors").resolve())
    return Policy(str(folder), None, label, cleanup=str(folder))


async def continue_episode(
    store: EpisodeStore,
    partial: PartialEpisode,
    new_id: str,
    *,
    policy: Policy,
    config: RunConfig,
) -> Recorded:
    """Run ``partial`` to its end under ``policy`` with the run's ``[inference]`` and
    ``[rollout]`` settings; store it as episode ``new_id``."""
    import shutil

    from transformers import AutoTokenizer

    from agentrl.inference import VLLMEngineClient
    from agentrl.models import resolve_model
    from agentrl.rollout import EpisodeRunner

    try:
        path = resolve_model(policy.model)
        tokenizer = AutoTokenizer.from_pretrained(path)
        start = dataclasses.replace(partial, episode_id=new_id, attempt=0)
        rank = max(16, config.trainer.lora.r) if policy.adapter else None
        async with await VLLMEngineClient.start(path, config.inference, seed=config.run.seed,
                                                max_lora_rank=rank) as client:  # fmt: skip
            if policy.adapter:
                await client.load_lora_adapter(policy.adapter)
            trajectories = await EpisodeRunner(client, tokenizer, config.rollout).resume(start)
    finally:
        if policy.cleanup:
            shutil.rmtree(policy.cleanup, ignore_errors=True)
    store.save_episode(trajectories, origin="replay")
    return Recorded(new_id, 0, trajectories[0].status, trajectories, None)


def restore_note(point: PartialEpisode) -> str:
    """How a fork's env is brought to the fork point, and when that is not exact."""
    steps = sum("action" in e for e in point.env_log[1:])
    calls = sum("tool" in e for e in point.env_log[1:])
    if point.env_state is not None:
        return (f"env restored from its state snapshot after {steps} steps and {calls} tool "
                "calls (exact)")  # fmt: skip
    note = (f"env rebuilt by replaying {steps} steps and {calls} tool calls from seed "
            f"{point.task.seed}")  # fmt: skip
    if calls:
        note += ("; exact only if the env and its tools are deterministic and the tools "
                 "have no effects outside the env (it has no get_state/set_state)")  # fmt: skip
    return note


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

"""Which policy continues a recorded episode, and running it on.

:func:`recorded_run` reads what a run directory recorded about itself (its config,
kind and env modules); :func:`recorded_policy` finds the policy that sampled an
episode (the checkpoint of that version when one was kept, else the final model, else
the base model); :func:`continue_episode` runs a checkpoint or fork point to its end
under it, with the run's ``[inference]`` and ``[rollout]`` settings.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.config import RunConfig
from agentrl.errors import ConfigError
from agentrl.replay.episodes import Recorded
from agentrl.store import EpisodeStore
from agentrl.types import PartialEpisode


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
        config = (
            RunConfig()
            if not isinstance(model, str)
            else RunConfig.from_dict({"model": {"path": model}})
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
    version: int = 0
    """The policy version the weights are (the label of the tokens it samples)."""
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
        label = (
            f"checkpoint {folder.name} (version {version}, the policy that sampled this episode)"
        )
        if (folder / "adapter_config.json").exists():
            return Policy(base, str(folder), label, version)
        return _assembled(folder, base, label, version)
    final = run_dir / "model"
    if final.is_dir():
        newest = newest_version(run_dir / "checkpoints", version)
        label = (
            f"the run's final model ({final}, version {newest}); no checkpoint of "
            f"version {version}, which sampled this episode, was kept"
        )
        if (final / "adapter_config.json").exists():
            return Policy(base, str(final), label, newest)
        return Policy(str(final), None, label, newest)
    return Policy(base, None, f"the run's base model ({base}); the run saved no weights yet")


def newest_version(root: Path, at_least: int) -> int:
    """The version of the newest kept checkpoint (the final model's), at least ``at_least``."""
    versions = [at_least]
    for meta in root.glob("step-*/trainer.json"):
        try:
            versions.append(int(json.loads(meta.read_text())["version"]))
        except (OSError, ValueError, KeyError):
            continue
    return max(versions)


def _checkpoint_of(root: Path, version: int) -> Path | None:
    for meta in sorted(root.glob("step-*/trainer.json")):
        try:
            if int(json.loads(meta.read_text())["version"]) == version:
                return meta.parent
        except (OSError, ValueError, KeyError):
            continue
    return None


def _assembled(checkpoint: Path, base: str, label: str, version: int) -> Policy:
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
    return Policy(str(folder), None, label, version, cleanup=str(folder))


def label_version(partial: PartialEpisode, policy: Policy) -> int:
    """The version the continuation's tokens carry: the policy's, or the prefix's newest
    when the policy is older (versions never decrease along a trajectory)."""
    newest = max((int(s.versions.max()) for s in partial.segments if len(s.versions)), default=-1)
    return max(policy.version, newest)


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

    from agentrl.chat.formats import resolve_chat_format
    from agentrl.inference import VLLMEngineClient
    from agentrl.models import resolve_model
    from agentrl.rollout import EpisodeRunner

    try:
        path = resolve_model(policy.model)
        tokenizer = AutoTokenizer.from_pretrained(path)
        start = dataclasses.replace(partial, episode_id=new_id, attempt=0)
        rank = max(16, config.trainer.lora.r) if policy.adapter else None
        # Tokens are labelled with the policy's version; never below the prefix's newest,
        # since versions must not decrease along a trajectory (label_version says so).
        version = label_version(partial, policy)
        engine = VLLMEngineClient.start(
            path, config.inference, seed=config.run.seed, max_lora_rank=rank, version=version
        )
        async with await engine as client:
            if policy.adapter:
                await client.load_lora_adapter(policy.adapter, version=version)
            runner = EpisodeRunner(
                client, tokenizer, config.rollout, chat=resolve_chat_format(tokenizer, config.model)
            )
            trajectories = await runner.resume(start)
    finally:
        if policy.cleanup:
            shutil.rmtree(policy.cleanup, ignore_errors=True)
    store.save_episode(trajectories, origin="replay")
    return Recorded(new_id, 0, trajectories[0].status, trajectories, None, partial.task)

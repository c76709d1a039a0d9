"""The config tree of a run (:class:`RunConfig`), loaded from TOML with overrides.

    agentrl train run.toml --train.steps=40 --trainer.lr=3e-4 --rollout.group_size=8

Every section is a frozen dataclass of :mod:`agentrl.config.sections`; the loader checks
every key and value against it and refuses anything it does not know, naming the key,
the value and what is allowed, before anything starts and before the run directory is
created. An override ``--a.b=value`` takes ``value`` as a TOML value (``3e-4``,
``true``, ``"x"``, ``[1, 2]``), or as a plain string when it does not parse as one.

Each section checks its own fields when built; :meth:`RunConfig.check` adds the rules
that span sections. That the env id is registered and the model exists is checked
above this layer (:func:`agentrl.run.check_config`), where envs and models are known.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from agentrl.config.cluster import ClusterConfig
from agentrl.config.health import HealthConfig
from agentrl.config.sections import (
    EnvConfig,
    EvalConfig,
    InferenceConfig,
    JobConfig,
    LogConfig,
    LossConfig,
    ModelConfig,
    RolloutConfig,
    TrainConfig,
    TrainerConfig,
)
from agentrl.errors import ConfigError

_SHORTHAND: dict[type, str] = {LossConfig: "kind"}
"""Sections that may be written as one string: ``trainer.loss = "grpo"`` is
``[trainer.loss] kind = "grpo"``."""


@dataclasses.dataclass(frozen=True, slots=True)
class RunConfig:
    """Everything ``agentrl train`` needs, one section per TOML table."""

    run: JobConfig = dataclasses.field(default_factory=JobConfig)
    """Run directory, name and seed."""
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """The policy."""
    env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
    """Where tasks come from."""
    inference: InferenceConfig = dataclasses.field(default_factory=InferenceConfig)
    """vLLM engine or servers."""
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    """How episodes run and are admitted."""
    trainer: TrainerConfig = dataclasses.field(default_factory=TrainerConfig)
    """Optimizer, loss, LoRA."""
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    """The training loop."""
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    """Held-out evaluation."""
    log: LogConfig = dataclasses.field(default_factory=LogConfig)
    """Progress, trackers, trace, plots."""
    health: HealthConfig = dataclasses.field(default_factory=HealthConfig)
    """Run-health warnings while training (docs/guides/health.md)."""
    cluster: ClusterConfig = dataclasses.field(default_factory=ClusterConfig)
    """Where the pieces run: this machine, or a Ray cluster (docs/guides/ray.md)."""

    # ---- loading ---------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path | None = None, overrides: Sequence[str] = ()) -> RunConfig:
        """Read ``path`` (TOML), apply ``--key.sub=value`` overrides, check types."""
        data: dict[str, Any] = {}
        if path is not None:
            p = Path(path)
            if not p.is_file():
                raise ConfigError(f"config file {str(p)!r} does not exist")
            try:
                data = tomllib.loads(p.read_text())
            except tomllib.TOMLDecodeError as e:
                raise ConfigError(f"{p} is not valid TOML: {e}") from None
        for item in overrides:
            _apply_override(data, item)
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunConfig:
        return _build(cls, data, "")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_toml(self) -> str:
        """The resolved config as TOML (every key set, defaults included)."""
        return _to_toml(self.to_dict())

    # ---- cross-checks ----------------------------------------------------------
    def check(self) -> None:
        """Check the rules that span sections (each section checked itself when built).

        Raises:
            ConfigError: naming the key, the value and what is allowed.
        """
        if not self.env.id:
            raise ConfigError(
                "env.id is required: a registered env id, e.g. agentrl/Calculator-v0 "
                "(or env.url, an env server that names its env)"
            )
        for key in ("rollout.temperature", "eval.temperature"):
            if not _get(self, key) > 0:
                raise ConfigError(
                    f"{key} = {_get(self, key)!r}; training needs it > 0 (the trainer "
                    f"divides logits by it)"
                )
        if self.rollout.max_staleness is None:
            raise ConfigError("rollout.max_staleness must be set for training (0 or more)")
        if self.rollout.max_tokens_per_turn >= self.inference.max_model_len:
            raise ConfigError(
                f"rollout.max_tokens_per_turn ({self.rollout.max_tokens_per_turn}) must be "
                f"below inference.max_model_len ({self.inference.max_model_len})"
            )
        self._check_servers()
        self._check_sleep()

    def _check_sleep(self) -> None:
        if not self.inference.sleep_during_train:
            return
        for key, want, why in (
            ("train.mode", "sync", "nothing is sampled during a step"),
            ("inference.mode", "engine", "vLLM in this process"),
            ("eval.every", 0, "no evaluation beside training"),
        ):
            value = _get(self, key)
            if value != want:
                raise ConfigError(
                    f"inference.sleep_during_train needs {key} = {want!r} ({why}); it is {value!r}"
                )

    def _check_servers(self) -> None:
        i = self.inference
        if i.servers and i.mode != "server":
            raise ConfigError(
                f"inference.servers = {i.servers!r} but inference.mode = {i.mode!r}; "
                'set inference.mode = "server" to use them'
            )
        for url in i.servers:
            if not url.startswith(("http://", "https://")):
                raise ConfigError(
                    f"inference.servers has {url!r}; each entry is a base URL such as "
                    '"http://127.0.0.1:8000"'
                )
        if len(set(i.servers)) != len(i.servers):
            raise ConfigError(f"inference.servers lists a server twice: {i.servers!r}")

    def batch_size(self) -> int:
        """Trajectories per optimizer step."""
        return self.rollout.group_size * self.train.groups_per_step


# ---- the typed loader ---------------------------------------------------------------


def _apply_override(data: dict[str, Any], item: str) -> None:
    text = item[2:] if item.startswith("--") else item
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {item!r} must look like --section.key=value")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    node, hint = data, RunConfig
    parts = key.split(".")
    for part in parts[:-1]:
        hints = typing.get_type_hints(hint) if dataclasses.is_dataclass(hint) else {}
        hint = hints.get(part)
        child = node.setdefault(part, {})
        if isinstance(child, str) and hint in _SHORTHAND:  # loss = "grpo", then loss.gamma
            child = node[part] = {_SHORTHAND[hint]: child}
        if not isinstance(child, dict):
            raise ConfigError(f"override {item!r}: {part!r} is not a section")
        node = child
    node[parts[-1]] = value


def _build(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix.rstrip('.') or 'the config'} must be a table, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in data if k not in fields]
    if unknown:
        where = prefix.rstrip(".") or "the top level"
        raise ConfigError(f"unknown key {prefix}{unknown[0]} ({where} has: {', '.join(fields)})")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        kwargs[name] = _convert(hints[name], value, f"{prefix}{name}")
    return cls(**kwargs)


def _convert(hint: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        if isinstance(value, str) and hint in _SHORTHAND:
            value = {_SHORTHAND[hint]: value}
        return _build(hint, value, f"{key}.")
    if origin is Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            raise ConfigError(
                f"{key} = {value!r} is not allowed; use one of: {', '.join(map(str, allowed))}"
            )
        return value
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        return _convert(args[0], value, key)
    if origin is dict or hint is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key} = {value!r} must be a table")
        return dict(value)
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        if not isinstance(value, list):
            raise ConfigError(f"{key} = {value!r} must be a list")
        return [_convert(item, v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is tuple:
        items = typing.get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{key} = {value!r} must be a list")
        if len(items) == 2 and items[1] is Ellipsis:
            items = (items[0],) * len(value)
        elif len(items) != len(value):
            raise ConfigError(f"{key} = {value!r} must be a list of {len(items)} values")
        pairs = enumerate(zip(items, value, strict=True))
        return tuple(_convert(t, v, f"{key}[{i}]") for i, (t, v) in pairs)
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} = {value!r} must be true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} = {value!r} must be an integer")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key} = {value!r} must be a number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} = {value!r} must be a string (quote it)")
        return value
    raise ConfigError(f"{key}: unsupported config type {hint!r}")  # a bug in this module


def _get(config: Any, key: str) -> Any:
    node = config
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _to_toml(data: Mapping[str, Any]) -> str:
    lines: list[str] = []

    def table(node: Mapping[str, Any], path: str) -> None:
        scalars = {k: v for k, v in node.items() if not isinstance(v, Mapping) or k == "kwargs"}
        if path:
            lines.append(f"\n[{path}]")
        for k, v in scalars.items():
            # TOML has no null: an unset optional is left out (it reads back unset).
            lines.append(f"# {k}: unset" if v is None else f"{k} = {_toml_value(v)}")
        for k, v in node.items():
            if isinstance(v, Mapping) and k != "kwargs":
                table(v, f"{path}.{k}" if path else k)

    table(data, "")
    return "\n".join(lines).lstrip("\n") + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value) if value == value and abs(value) != float("inf") else f'"{value}"'
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return (
            "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
        )
    raise TypeError(f"cannot write {value!r} as TOML")

"""One typed config tree for ``agentrl train``, loaded from TOML with overrides.

    agentrl train run.toml --train.steps=40 --trainer.lr=3e-4 --rollout.group_size=8

Every section is a frozen dataclass; the loader checks every key and value against it
and refuses anything it does not know, naming the key, the value and what is allowed,
before anything starts and before the run directory is created. An override
``--a.b=value`` takes ``value`` as a TOML value (``3e-4``, ``true``, ``"x"``,
``[1, 2]``), or as a plain string when it does not parse as one.

:meth:`RunConfig.check` then builds the components' own configs (scheduler, loss,
trainer, loop), so their cross-field rules fail here too, and checks that the env id
is registered and the model path exists.
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

from agentrl.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class RunSection:
    out: str = ""
    """Run directory (default: runs/NAME-TIME)."""
    name: str = "run"
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class ModelSection:
    path: str = "tiny"
    """'tiny' (built locally), a model folder, or a hub name."""


@dataclasses.dataclass(frozen=True)
class EnvSection:
    id: str = ""
    """A registered env id, e.g. agentrl/Calculator-v0."""
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments for the env's constructor."""
    imports: list[str] = dataclasses.field(default_factory=list)
    """Modules or .py files to import first (where your env registers itself)."""
    first_seed: int = 0
    """Training tasks use seeds first_seed, first_seed + 1, ..."""


@dataclasses.dataclass(frozen=True)
class InferenceSection:
    mode: Literal["engine", "server"] = "engine"
    """engine: vLLM in this process; server: `vllm serve` on 127.0.0.1 over HTTP."""
    dtype: str = "float32"
    max_model_len: int = 512
    kv_cache_mib: int = 256
    max_num_seqs: int = 256
    enforce_eager: bool = True
    startup_timeout_s: float = 300.0
    request_timeout_s: float = 300.0
    servers: list[str] = dataclasses.field(default_factory=list)
    """mode = "server": URLs of running servers (`agentrl serve`); empty: agentrl starts
    num_servers of them on 127.0.0.1 (and restarts one that dies)."""
    num_servers: int = 1
    """Servers agentrl starts itself when servers is empty."""
    reconnect_timeout_s: float = 300.0
    """How long requests wait for a server when none is healthy; then the run stops."""
    health_interval_s: float = 1.0
    max_restarts: int = 3
    """How often agentrl restarts a server it started that died."""
    weights_dir: str = ""
    """Where published weights are written for the engine or servers to load; empty: a
    RAM folder on this machine. Servers on other machines need a folder they can all
    read at the same path (a shared file system)."""


@dataclasses.dataclass(frozen=True)
class RolloutSection:
    group_size: int = 8
    """Episodes per task (same seed), for group-relative advantages."""
    concurrency: int = 64
    max_turns: int = 8
    max_tool_calls: int = 8
    max_tokens_per_turn: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    tool_timeout_s: float = 10.0
    env_timeout_s: float = 60.0
    max_staleness: int = 1
    """An episode admitted at version v is trained by version v + max_staleness."""
    max_retries: int = 1
    update_policy: Literal["resume", "keep", "drop"] = "resume"


@dataclasses.dataclass(frozen=True)
class LoraSection:
    enabled: bool = False
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = dataclasses.field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )


@dataclasses.dataclass(frozen=True)
class TrainerSection:
    lr: float = 1e-5
    loss: Literal["grpo", "dapo", "dr_grpo", "cispo", "bnpo"] = "dapo"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.28
    ratio_level: Literal["token", "sequence"] = "token"
    beta: float = 0.0
    correction: Literal[
        "none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"
    ] = "token_truncate"
    correction_max: float = 2.0
    max_token_staleness: int = -1
    """Mask tokens more than this many versions old (-1: keep all)."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    micro_batch_tokens: int = 4096
    lora: LoraSection = dataclasses.field(default_factory=LoraSection)


@dataclasses.dataclass(frozen=True)
class TrainSection:
    steps: int = 20
    groups_per_step: int = 4
    mode: Literal["async", "sync"] = "async"
    checkpoint_every: int = 5
    """Steps between trainer checkpoints (0: only at the end)."""


@dataclasses.dataclass(frozen=True)
class EvalSection:
    episodes: int = 0
    """Held-out episodes evaluated before and after training (0: no evaluation)."""
    first_seed: int = 1_000_000
    """Evaluation seeds start here, far from the training seeds."""
    temperature: float = 1.0
    success_reward: float = 1.0
    """An episode succeeds when its total reward is at least this."""


@dataclasses.dataclass(frozen=True)
class LogSection:
    progress: Literal["auto", "rich", "plain", "none"] = "auto"
    """auto: a live display on a terminal, one line per step otherwise."""
    tensorboard: bool = True
    wandb: bool = False
    trackio: bool = False
    trace: bool = True
    plots: bool = True
    status_every_s: float = 0.5
    """How often status.json (read by `agentrl top`) is rewritten."""


@dataclasses.dataclass(frozen=True)
class RunConfig:
    run: RunSection = dataclasses.field(default_factory=RunSection)
    model: ModelSection = dataclasses.field(default_factory=ModelSection)
    env: EnvSection = dataclasses.field(default_factory=EnvSection)
    inference: InferenceSection = dataclasses.field(default_factory=InferenceSection)
    rollout: RolloutSection = dataclasses.field(default_factory=RolloutSection)
    trainer: TrainerSection = dataclasses.field(default_factory=TrainerSection)
    train: TrainSection = dataclasses.field(default_factory=TrainSection)
    eval: EvalSection = dataclasses.field(default_factory=EvalSection)
    log: LogSection = dataclasses.field(default_factory=LogSection)

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
        """The resolved config as TOML (every key, defaults included)."""
        return _to_toml(self.to_dict())

    # ---- cross-checks ----------------------------------------------------------
    def check(self) -> None:
        """Build every component config and check the env and model exist.

        Raises:
            ConfigError: naming the key, the value and what is allowed.
        """
        if not self.env.id:
            raise ConfigError("env.id is required: a registered env id, e.g. agentrl/Calculator-v0")
        _positive(self, "rollout.group_size", "rollout.concurrency", "rollout.max_turns",
                  "rollout.max_tokens_per_turn", "train.steps", "train.groups_per_step",
                  "inference.max_model_len", "inference.kv_cache_mib",
                  "inference.max_num_seqs")  # fmt: skip
        for key in ("rollout.temperature", "trainer.lr", "eval.temperature"):
            if not _get(self, key) > 0:
                raise ConfigError(f"{key} = {_get(self, key)!r}; it must be > 0")
        for key in ("eval.episodes", "train.checkpoint_every", "rollout.max_staleness",
                    "rollout.max_retries"):  # fmt: skip
            if _get(self, key) < 0:
                raise ConfigError(f"{key} = {_get(self, key)!r}; it must be >= 0")
        if not 0 < self.rollout.top_p <= 1:
            raise ConfigError(f"rollout.top_p = {self.rollout.top_p!r}; use a value in (0, 1]")
        if self.rollout.max_tokens_per_turn >= self.inference.max_model_len:
            raise ConfigError(
                f"rollout.max_tokens_per_turn ({self.rollout.max_tokens_per_turn}) must be "
                f"below inference.max_model_len ({self.inference.max_model_len})"
            )
        self._check_servers()
        self.scheduler_config()
        self.trainer_config()
        self.loop_config()
        self.rollout_config()
        self._check_env()
        self._check_model()

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
        _positive(self, "inference.num_servers", "inference.reconnect_timeout_s",
                  "inference.health_interval_s")  # fmt: skip
        if i.max_restarts < 0:
            raise ConfigError(f"inference.max_restarts = {i.max_restarts!r}; it must be >= 0")

    def _check_env(self) -> None:
        import gymnasium as gym

        import envs  # noqa: F401  (registers the shipped envs)

        import_all(self.env.imports)
        if self.env.id not in gym.registry:
            known = sorted(k for k in gym.registry if k.startswith("agentrl/"))
            raise ConfigError(
                f"env.id = {self.env.id!r} is not registered; shipped envs: {known}. For your "
                f"own env, list the module or file that registers it in env.imports"
            )
        try:
            gym.make(self.env.id, **self.env.kwargs).close()
        except TypeError as e:
            raise ConfigError(
                f"env.kwargs = {self.env.kwargs!r} do not fit {self.env.id}: {e}"
            ) from None

    def _check_model(self) -> None:
        from agentrl.models import check_chat_template, resolve_model

        if self.model.path != "tiny":
            path = resolve_model(self.model.path)  # raises ModelNotFoundError (a ConfigError)
            if Path(path).is_dir():
                check_chat_template(path)

    # ---- component configs -----------------------------------------------------
    def batch_size(self) -> int:
        return self.rollout.group_size * self.train.groups_per_step

    def scheduler_config(self):  # -> SchedulerConfig
        from agentrl.rollout.scheduler import SchedulerConfig

        r = self.rollout
        try:
            return SchedulerConfig(concurrency=r.concurrency, group_size=r.group_size,
                                   max_retries=r.max_retries, max_staleness=r.max_staleness,
                                   batch_size=self.batch_size())  # fmt: skip
        except ConfigError as e:
            raise ConfigError(f"rollout: {e}") from None

    def rollout_config(self, *, temperature: float | None = None):  # -> RolloutConfig
        from agentrl.rollout import RolloutConfig

        r = self.rollout
        try:
            return RolloutConfig(
                max_turns=r.max_turns, max_tool_calls=r.max_tool_calls,
                max_tokens_per_turn=r.max_tokens_per_turn,
                temperature=r.temperature if temperature is None else temperature,
                top_p=r.top_p, tool_timeout_s=r.tool_timeout_s, env_timeout_s=r.env_timeout_s,
            )  # fmt: skip
        except ValueError as e:
            raise ConfigError(f"rollout: {e}") from None

    def trainer_config(self):  # -> TrainerConfig
        from agentrl.trainer.losses import LossConfig
        from agentrl.trainer.trainer import LoraSettings, TrainerConfig

        t = self.trainer
        loss = LossConfig(
            kind=t.loss, epsilon_low=t.epsilon_low, epsilon_high=t.epsilon_high,
            ratio_level=t.ratio_level, beta=t.beta, correction=t.correction,  # type: ignore[arg-type]
            correction_max=t.correction_max,
            max_token_staleness=None if t.max_token_staleness < 0 else t.max_token_staleness,
        )  # fmt: skip
        lora = None
        if t.lora.enabled:
            lora = LoraSettings(r=t.lora.r, alpha=t.lora.alpha, dropout=t.lora.dropout,
                                target_modules=tuple(t.lora.target_modules))  # fmt: skip
        return TrainerConfig(lr=t.lr, weight_decay=t.weight_decay, max_grad_norm=t.max_grad_norm,
                             loss=loss, scale_rewards=t.scale_rewards,
                             micro_batch_tokens=t.micro_batch_tokens,
                             temperature=self.rollout.temperature, lora=lora,
                             seed=self.run.seed)  # fmt: skip

    def loop_config(self):  # -> LoopConfig
        from agentrl.trainer.loop import LoopConfig

        return LoopConfig(self.train.steps, self.train.groups_per_step, mode=self.train.mode,
                          checkpoint_every=self.train.checkpoint_every)  # fmt: skip

    def inference_config(self, model_path: str):  # -> InferenceConfig
        from agentrl.inference import InferenceConfig

        i = self.inference
        return InferenceConfig(
            model=model_path, dtype=i.dtype, max_model_len=i.max_model_len,
            kv_cache_memory_bytes=i.kv_cache_mib * 2**20, enforce_eager=i.enforce_eager,
            seed=self.run.seed, enable_lora=self.trainer.lora.enabled,
            max_lora_rank=max(16, self.trainer.lora.r), max_num_seqs=i.max_num_seqs,
            request_timeout_s=i.request_timeout_s, startup_timeout_s=i.startup_timeout_s,
        )  # fmt: skip


def import_all(imports: Sequence[str]) -> None:
    """Import modules or run .py files (where users register their envs)."""
    import importlib
    import runpy

    for target in imports:
        try:
            if target.endswith(".py"):
                if not Path(target).is_file():
                    raise ConfigError(f"env.imports: file {target!r} does not exist")
                runpy.run_path(target, run_name="__agentrl_env__")
            else:
                importlib.import_module(target)
        except ModuleNotFoundError as e:
            raise ConfigError(f"env.imports: cannot import {target!r}: {e}") from None


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
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
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


def _positive(config: Any, *keys: str) -> None:
    for key in keys:
        if _get(config, key) < 1:
            raise ConfigError(f"{key} = {_get(config, key)!r}; it must be at least 1")


def _to_toml(data: Mapping[str, Any]) -> str:
    lines: list[str] = []

    def table(node: Mapping[str, Any], path: str) -> None:
        scalars = {k: v for k, v in node.items() if not isinstance(v, Mapping) or k == "kwargs"}
        if path:
            lines.append(f"\n[{path}]")
        for k, v in scalars.items():
            lines.append(f"{k} = {_toml_value(v)}")
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

"""Every setting of agentrl, one frozen dataclass per TOML section, one default per field.

These classes are the components' own configs: the runner and scheduler take
:class:`RolloutConfig`, the trainer :class:`TrainerConfig` (with :class:`LossConfig`
and :class:`LoraConfig`), the training loop :class:`TrainConfig`, the vLLM clients
:class:`InferenceConfig`. Nothing translates between two trees, so a default written
here is the default everywhere (``agentrl config --defaults`` prints them all).

Each class checks its own invariants in ``__post_init__`` and raises
:class:`~agentrl.errors.ConfigError` naming the dotted key (``rollout.max_turns``),
the value, and what is allowed. Cross-section rules live in
:meth:`agentrl.config.RunConfig.check`.

The line under each field is its documentation; ``agentrl config --defaults`` prints it
as the TOML comment above the key.

The training sections (``[trainer]``, ``[trainer.loss]``, ``[trainer.lora]``, ``[train]``)
live in :mod:`agentrl.config.training`, what they share in :mod:`agentrl.config.fields`;
both are importable from here. This package is the ground floor: it imports only the
standard library and :mod:`agentrl.errors`.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal

from agentrl.config.fields import (
    AdvantageScheme,
    CorrectionMode,
    LossKind,
    PackedAttention,
    StepKey,
    TrainerPrecision,
    UpdatePolicy,
    WorkerLoop,
    _at_least,
    _frozen,
)
from agentrl.config.training import LoraConfig, LossConfig, TrainConfig, TrainerConfig
from agentrl.errors import ConfigError

__all__ = [
    "DATASET_ENV_ID",
    "AdvantageScheme",
    "CorrectionMode",
    "EnvConfig",
    "EvalConfig",
    "InferenceConfig",
    "JobConfig",
    "LogConfig",
    "LoraConfig",
    "LossConfig",
    "LossKind",
    "ModelConfig",
    "PackedAttention",
    "RolloutConfig",
    "StepKey",
    "TrainConfig",
    "TrainerConfig",
    "TrainerPrecision",
    "UpdatePolicy",
    "WorkerLoop",
]


@_frozen
class JobConfig:
    """``[run]``: where the run lives and what seeds it."""

    out: str = ""
    """Run directory (empty: runs/NAME-TIME)."""
    name: str = "run"
    """The run's name, in the default run directory and the trackers."""
    seed: int = 0
    """Seeds the trainer (torch) and the inference engine's sampler."""
    stop_grace_s: float = 25.0
    """After SIGTERM or SIGHUP, seconds to stop cleanly before stopping at once."""

    def __post_init__(self) -> None:
        if not self.stop_grace_s > 0:
            raise ConfigError(f"run.stop_grace_s = {self.stop_grace_s!r}; it must be > 0")


@_frozen
class ModelConfig:
    """``[model]``: the policy."""

    path: str = "tiny"
    """'tiny' (built locally), a model folder, or a hub name."""
    tool_format: str = "auto"
    """How tool calls are read: auto (from the chat template) or a vLLM tool-parser name
    (hermes, llama3_json, mistral, olmo3, pythonic, qwen3_coder, ...)."""
    reasoning: str = "auto"
    """Thinking split from the answer: auto (from the chat template), a vLLM
    reasoning-parser name (qwen3, deepseek_r1, ...), or none."""
    keep_thinking: bool = False
    """Keep past turns as sampled (thinking included) where the template would rewrite
    them: no new segment, but a history the template itself would not render."""
    chat_template_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Variables for every rendering of the chat template (and the reasoning parser),
    e.g. {enable_thinking = false} for Qwen3."""

    def __post_init__(self) -> None:
        for name in ("tool_format", "reasoning"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.replace("-", "_").isidentifier():
                raise ConfigError(
                    f"model.{name} = {value!r}; use auto or a vLLM parser name "
                    f"(`agentrl check-model MODEL` shows the detected one)"
                )
        # apply_chat_template's own arguments: agentrl sets them, they are not variables.
        taken = {
            "conversation",
            "tools",
            "documents",
            "chat_template",
            "add_generation_prompt",
            "continue_final_message",
            "tokenize",
            "return_dict",
        }
        for key in self.chat_template_kwargs:
            if not isinstance(key, str) or not key.isidentifier() or key in taken:
                raise ConfigError(
                    f"model.chat_template_kwargs has the key {key!r}; use template variables "
                    f"such as enable_thinking, not {', '.join(sorted(taken))}"
                )


DATASET_ENV_ID = "agentrl/Dataset-v0"
"""The env of ``env.dataset`` (agentrl.dataset_env.DatasetEnv)."""


@_frozen
class EnvConfig:
    """``[env]``: which env the tasks come from."""

    id: str = ""
    """A registered env id, e.g. agentrl/Calculator-v0."""
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments for the env's constructor."""
    imports: list[str] = dataclasses.field(default_factory=list)
    """Modules or .py files to import first (where your env registers itself)."""
    first_seed: int = 0
    """Training tasks use seeds first_seed, first_seed + 1, ..."""
    dataset: str = ""
    """Tasks from a dataset (JSONL/Parquet/CSV file, folder or hub name): id becomes
    agentrl/Dataset-v0; kwargs give verifier (required), split, prompt_column, tools."""
    url: str = ""
    """An OpenEnv env server to run the episodes on (`agentrl serve-env`, or any
    OpenEnv server), e.g. http://10.0.0.5:8100; id may be left empty: the server names it."""
    urls: list[str] = dataclasses.field(default_factory=list)
    """Several env servers serving env.id: sessions go to the least loaded; one that
    dies fails only its episodes (env_unavailable), retried on the others."""
    request_timeout_s: float = 60.0
    """Deadline for one call to an env server (reset, step, state, a tool call); past it
    the episode fails (env_timeout) and the server is left out until /health answers."""
    reconnect_timeout_s: float = 120.0
    """How long new episodes wait for an env server when none is up; then the run stops
    (continue it with agentrl train --resume)."""
    health_interval_s: float = 1.0
    """Seconds between /health checks of each env server."""

    def __post_init__(self) -> None:
        for name in ("request_timeout_s", "reconnect_timeout_s", "health_interval_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"env.{name} = {getattr(self, name)!r}; it must be > 0")
        servers = self.servers
        if len(set(servers)) != len(servers):
            raise ConfigError(f"env.url and env.urls list a server twice: {servers}")
        for url in servers:
            if not url.startswith(("http://", "https://", "ws://", "wss://")):
                raise ConfigError(
                    f"env server {url!r} (env.url/env.urls) is not an http:// or ws:// URL, "
                    f"e.g. http://127.0.0.1:8100"
                )
        if servers and (self.dataset or self.kwargs):
            which = "env.dataset" if self.dataset else "env.kwargs"
            raise ConfigError(
                f"{which} with env servers (env.url/env.urls): the env is built on the server; "
                f"give its arguments there (agentrl serve-env ID --kwargs JSON)"
            )
        if len(servers) > 1 and not self.id:
            raise ConfigError(
                "env.urls lists several env servers but env.id is empty; name the env they "
                "serve (each server's id is checked against it)"
            )
        if not self.dataset:
            return
        if self.id not in ("", DATASET_ENV_ID):
            raise ConfigError(
                f"env.dataset = {self.dataset!r} with env.id = {self.id!r}; "
                f"leave env.id empty (or {DATASET_ENV_ID!r}) for a dataset"
            )
        given = self.kwargs.get("dataset", self.dataset)
        if given != self.dataset:
            raise ConfigError(
                f"env.dataset = {self.dataset!r} but env.kwargs.dataset = {given!r}; "
                f"give it once, as env.dataset"
            )
        # the env id and constructor argument every consumer of [env] reads
        object.__setattr__(self, "id", DATASET_ENV_ID)
        object.__setattr__(self, "kwargs", {**self.kwargs, "dataset": self.dataset})

    @property
    def servers(self) -> list[str]:
        """The env servers' base URLs (env.url, then env.urls), without a trailing /."""
        return [u.rstrip("/") for u in ([self.url] if self.url else []) + list(self.urls)]

    @property
    def remote(self) -> bool:
        """Whether the episodes run on env servers (env.url or env.urls)."""
        return bool(self.url or self.urls)


@_frozen
class InferenceConfig:
    """``[inference]``: the vLLM engine or servers that sample episodes."""

    mode: Literal["engine", "server"] = "engine"
    """engine: vLLM in this process; server: `vllm serve` on 127.0.0.1 over HTTP."""
    dtype: str = "float32"
    """float32 on CPU: bf16 with eager mode or LoRA crashes vLLM's CPU attention."""
    max_model_len: int = 512
    """Context window in tokens (prompt and every turn of an episode)."""
    kv_cache_mib: int = 256
    """KV cache size; vLLM's default (a fraction of all RAM) fails to start on CPU."""
    max_num_seqs: int = 256
    """Requests vLLM batches at once."""
    enforce_eager: bool = True
    """No CUDA graphs / torch.compile (fast start; required on CPU)."""
    startup_timeout_s: float = 300.0
    """How long to wait for an engine or server to become ready."""
    request_timeout_s: float = 300.0
    """Deadline for one generation request (and for each admin call to a server)."""
    servers: list[str] = dataclasses.field(default_factory=list)
    """mode = "server": URLs of running servers (`agentrl serve`); empty: agentrl starts
    num_servers of them on 127.0.0.1 (and restarts one that dies)."""
    num_servers: int = 1
    """Servers agentrl starts itself when servers is empty."""
    reconnect_timeout_s: float = 300.0
    """How long requests wait for a server when none is healthy; then the run stops."""
    health_interval_s: float = 1.0
    """Seconds between health checks of each server."""
    max_restarts: int = 3
    """How often agentrl restarts a server it started that died."""
    weights_dir: str = ""
    """Where published weights are written for the engine or servers to load; empty: a
    RAM folder on this machine. Servers on other machines need a shared folder."""
    weight_transfer: str | None = None
    """vLLM weight-transfer backend for file-less updates ('nccl', GPU, engine mode)."""
    gpu_memory_utilization: float | None = None
    """On a GPU: the share of its memory vLLM takes for weights and KV cache (vLLM's
    own setting); unset: weights plus kv_cache_mib. With the trainer on the same GPU
    (engine mode) the two budgets are checked together at start."""
    keep_off_worker_cores: bool = True
    """engine mode on CPU: once vLLM's worker has bound itself to its cores (core 0 of a
    2-core machine), keep this process's threads on the others, so that the event loop
    and its threads do not preempt the forward pass (agentrl.runtime.cores; nothing happens where
    no worker is bound, e.g. on a GPU). vLLM leaves one core per worker to the rest
    (VLLM_CPU_NUM_OF_RESERVED_CPU reserves more, for heavy envs on a large machine)."""
    sleep_during_train: bool = False
    """train.mode = "sync" on one GPU: put vLLM to sleep (level 1: weights to CPU, KV
    cache freed) for each train step and wake it to publish (needs a GPU: vLLM's sleep
    mode)."""

    def __post_init__(self) -> None:
        _at_least("inference", self, 2, "max_model_len")
        _at_least("inference", self, 1, "kv_cache_mib", "max_num_seqs", "num_servers")
        _at_least("inference", self, 0, "max_restarts")
        share = self.gpu_memory_utilization
        if share is not None and not 0 < share <= 1:
            raise ConfigError(
                f"inference.gpu_memory_utilization = {share!r}; it must be in (0, 1], "
                f"e.g. 0.3 to leave the rest of the GPU to the trainer"
            )
        for name in (
            "startup_timeout_s",
            "request_timeout_s",
            "reconnect_timeout_s",
            "health_interval_s",
        ):
            if not getattr(self, name) > 0:
                raise ConfigError(f"inference.{name} = {getattr(self, name)!r}; it must be > 0")

    @property
    def kv_cache_bytes(self) -> int:
        return self.kv_cache_mib * 2**20


@_frozen
class RolloutConfig:
    """``[rollout]``: how episodes are run and admitted (runner and scheduler)."""

    group_size: int = 8
    """Episodes per task (same seed), for group-relative advantages."""
    concurrency: int = 64
    """Episodes running at once."""
    max_turns: int = 8
    """Assistant turns per episode (tool turns included)."""
    max_tool_calls: int = 8
    """Tool calls per episode; past it the episode is truncated."""
    max_tokens_per_turn: int = 64
    """Tokens sampled per assistant turn at most."""
    temperature: float = 1.0
    """Sampling temperature (the trainer takes logprobs at the same temperature)."""
    top_p: float = 1.0
    """Nucleus sampling mass, in (0, 1]."""
    tool_timeout_s: float = 10.0
    """Deadline for one tool call; past it the call returns an error to the model."""
    env_timeout_s: float = 60.0
    """Deadline for one env call (make, reset, step, close); past it the episode fails.
    It fires within min(50 ms, 1/64 of it) and 2 ms after the deadline, never before it
    (the calls share one loop timer: agentrl.runtime.threads.Deadlines). inf: no deadline."""
    max_staleness: int | None = 1
    """An episode admitted at version v is trained by version v + max_staleness
    (unset in Python: no bound)."""
    max_retries: int = 1
    """Attempts more for an episode that failed (infrastructure or env error)."""
    update_policy: UpdatePolicy = "resume"
    """At a weight update, in-flight episodes resume under the new weights, keep
    sampling from the old prefix, or are dropped and run again."""
    ignore_eos: bool = False
    """Every turn samples exactly max_tokens_per_turn (benchmarks)."""
    workers: int = 1
    """Processes that run the episodes (rendering, tokenization, envs, tools), each its own
    event loop; more than 1 when one core cannot feed the engine (agentrl.rollout.workers)."""
    worker_event_loop: WorkerLoop = "uvloop"
    """The event loop of each rollout worker process (workers > 1): uvloop (libuv, in C;
    installed with agentrl) or Python's own asyncio loop. On uvloop the workers spent about
    0.9 of the CPU per turn (benchmarks/bench_ceiling.py, 1024 x 3 x 32); asyncio is the
    fallback for an env or tool that does not work on uvloop."""
    checkpoint_interval_s: float = 1.0
    """An episode is checkpointed (durably, with everything to resume it exactly) at its
    first turn boundary, then at a boundary only once this long has passed since its last
    checkpoint: a crash redoes at most this much of each episode, plus a turn. 0: at every
    turn boundary. Each checkpoint holds the whole episode, so on fast turns checkpointing
    every one was a quarter of the rollout loop's CPU (20-turn episodes)."""

    def __post_init__(self) -> None:
        _at_least(
            "rollout",
            self,
            1,
            "group_size",
            "concurrency",
            "max_turns",
            "max_tokens_per_turn",
            "workers",
        )
        _at_least("rollout", self, 0, "max_retries", "max_tool_calls")
        if not self.checkpoint_interval_s >= 0:
            raise ConfigError(
                f"rollout.checkpoint_interval_s = {self.checkpoint_interval_s!r}; it must be "
                ">= 0 (0: a checkpoint at every turn boundary)"
            )
        for name in ("env_timeout_s", "tool_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(
                    f"rollout.{name} = {getattr(self, name)!r}; it must be a number of "
                    "seconds > 0 (inf: no deadline)"
                )
        if self.worker_event_loop not in typing.get_args(WorkerLoop):
            raise ConfigError(
                f"rollout.worker_event_loop = {self.worker_event_loop!r} is not allowed; use "
                f"one of: {', '.join(typing.get_args(WorkerLoop))}"
            )
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ConfigError(f"rollout.max_staleness = {self.max_staleness!r}; it must be >= 0")
        if not self.temperature >= 0:
            raise ConfigError(f"rollout.temperature = {self.temperature!r}; it must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"rollout.top_p = {self.top_p!r}; use a value in (0, 1]")
        if self.concurrency < self.group_size:
            raise ConfigError(
                f"rollout.concurrency ({self.concurrency}) must be at least rollout.group_size "
                f"({self.group_size}): a group's episodes run at the same time"
            )


@_frozen
class EvalConfig:
    """``[eval]``: held-out evaluation before, during (``every``) and after training."""

    episodes: int = 0
    """Held-out episodes evaluated before and after training (0: no evaluation)."""
    first_seed: int = 1_000_000
    """Evaluation seeds start here, far from the training seeds."""
    temperature: float = 1.0
    """Sampling temperature of evaluation episodes."""
    success_reward: float = 1.0
    """An episode succeeds when its total reward is at least this."""
    k: int = 1
    """Samples per held-out task (pass@k and avg@k): `agentrl eval` and train's evaluations."""
    every: int = 0
    """Also evaluate every N optimizer steps while training, beside it on the same engine
    (0: only before and after)."""

    def __post_init__(self) -> None:
        _at_least("eval", self, 0, "episodes")
        _at_least("eval", self, 1, "k")
        _at_least("eval", self, 0, "every")
        if self.every and not self.episodes:
            raise ConfigError(
                f"eval.every = {self.every} needs held-out episodes; set eval.episodes >= 1 "
                f"(it is 0) or eval.every = 0"
            )
        if not self.temperature >= 0:
            raise ConfigError(f"eval.temperature = {self.temperature!r}; it must be >= 0")


@_frozen
class LogConfig:
    """``[log]``: progress, trackers, trace and plots."""

    progress: Literal["auto", "rich", "plain", "none"] = "auto"
    """auto: a live display on a terminal, one line per step otherwise."""
    tensorboard: bool = True
    """Write TensorBoard event files under tb/."""
    wandb: bool = False
    """Log to Weights & Biases (needs wandb installed and logged in)."""
    trackio: bool = False
    """Log to trackio (needs trackio installed)."""
    trace: bool = True
    """Write trace.json (Perfetto / Chrome trace)."""
    plots: bool = True
    """Write plots/*.png at the end."""
    status_every_s: float = 0.5
    """How often status.json (read by `agentrl top`) is rewritten."""

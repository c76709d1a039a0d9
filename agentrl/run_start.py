"""The components of one ``agentrl train`` run started: the trainer (its placement checked
against vLLM's on a shared GPU), the inference client or servers, the env servers' pool.

:mod:`agentrl.run` wires them; each start here enters what it opens in the run's
``contextlib.AsyncExitStack`` where it has something to close.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.config import RunConfig
from agentrl.errors import ConfigError
from agentrl.status import Reporter

if TYPE_CHECKING:
    from agentrl.inference import InferenceClient, ServerPool
    from agentrl.trainer.trainer import Trainer

__all__ = [
    "EngineSleep",
    "check_colocated",
    "lora_rank",
    "start_env_servers",
    "start_inference",
    "start_trainer",
    "weights_dir",
]


async def start_env_servers(
    config: RunConfig, stack: contextlib.AsyncExitStack, reporter: Reporter
) -> Callable[..., Any] | None:
    """With ``[env] url``/``urls``: the env servers' pool, in ``stack``; its make (None
    without: Gymnasium's)."""
    env = config.env
    if not env.remote:
        return None
    from agentrl.remote import EnvServerPool

    pool = await stack.enter_async_context(EnvServerPool.from_config(env))
    up = [m["url"] for m in pool.describe() if m["up"]]
    reporter.say(
        f"env {env.id} on {len(up)} of {len(env.servers)} env server(s): "
        f"{', '.join(up) or 'none up yet'}"
    )
    return pool.make


async def start_trainer(
    cfg: RunConfig,
    model_path: str,
    accelerator: Any,
    resume: bool,
    reporter: Reporter,
    run_dir: Path,
) -> Trainer:
    from agentrl.trainer.tokenrecord import TokenRecorder
    from agentrl.trainer.trainer import Trainer

    recorder = TokenRecorder(run_dir) if cfg.trainer.record_tokens else None
    trainer = await asyncio.to_thread(
        Trainer,
        model_path,
        cfg.trainer,
        temperature=cfg.rollout.temperature,
        seed=cfg.run.seed,
        accelerator=accelerator,
        recorder=recorder,
    )
    reporter.say(trainer.placement())
    for level, line in trainer.advice():
        if level == "warning":
            reporter.warn(line)
        else:
            reporter.say(f"note: {line}")
    check_colocated(cfg, trainer, reporter)
    if trainer.world > 1:
        reporter.say(
            f"training on {trainer.world} processes "
            f"({trainer.accelerator.distributed_type}); this is rank 0"
        )
    return trainer


def check_colocated(cfg: RunConfig, trainer: Trainer, reporter: Reporter) -> None:
    """With the trainer on a GPU and vLLM in this process: check that both fit on it
    (an estimate, :func:`agentrl.trainer.placement.colocated_plan`) before vLLM starts,
    and say the budget.

    Raises:
        ConfigError: they do not fit (naming the settings that would), or
            ``inference.sleep_during_train`` without a GPU trainer.
    """
    if trainer.device.type != "cuda":
        if cfg.inference.sleep_during_train:
            raise ConfigError(
                "inference.sleep_during_train needs the trainer and vLLM on a GPU (vLLM's "
                f"sleep mode); the trainer is on {trainer.device}"
            )
        return
    if cfg.inference.mode != "engine":
        return
    import torch

    from agentrl.trainer.placement import colocated_error, colocated_plan

    total = torch.cuda.get_device_properties(trainer.device).total_memory
    params = sum(p.numel() for p in trainer.unwrapped.parameters())
    plan = colocated_plan(
        trainer.unwrapped.config,
        params,
        cfg.trainer,
        cfg.inference,
        precision=trainer.precision,
        chunked=trainer.chunked_logprob,
        total=total,
    )
    if not plan.fits():
        raise colocated_error(plan, cfg.trainer, cfg.inference)
    reporter.say(f"one GPU for the trainer and vLLM: {plan.describe()}")


class EngineSleep:
    """vLLM asleep during each train step (``inference.sleep_during_train``): level 1,
    then the trainer's cached free blocks go back to the GPU before vLLM wakes."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    async def sleep(self) -> None:
        await self.engine.sleep()

    async def wake_up(self) -> None:
        import torch

        torch.cuda.empty_cache()
        await self.engine.wake_up()


def lora_rank(config: RunConfig) -> int | None:
    """The adapter rank vLLM must accept: None without LoRA (at least 16, vLLM's floor)."""
    return max(16, config.trainer.lora.r) if config.trainer.lora.enabled else None


async def start_inference(
    cfg: RunConfig,
    model_path: str,
    log_dir: Path,
    stack: contextlib.AsyncExitStack,
    reporter: Reporter,
    managed: Any,
) -> tuple[InferenceClient, ServerPool | None]:
    """The inference client, entered in ``stack``: vLLM in this process, or the servers in
    inference.servers (num_servers started here, or ``managed`` by the cluster) in one pool."""
    from agentrl.inference import ServerPool, VLLMEngineClient, VLLMServer

    i = cfg.inference
    if i.mode != "server":
        engine = await VLLMEngineClient.start(
            model_path, i, seed=cfg.run.seed, log_dir=log_dir, max_lora_rank=lora_rank(cfg)
        )
        return await stack.enter_async_context(engine), None
    urls, managed = list(i.servers), dict(managed)
    if not urls:
        started = await asyncio.gather(
            *(
                VLLMServer.start(
                    model_path, i, seed=cfg.run.seed, max_lora_rank=lora_rank(cfg), log_dir=log_dir
                )
                for _ in range(i.num_servers)
            ),
            return_exceptions=True,
        )
        for server in started:
            if isinstance(server, VLLMServer):
                stack.push_async_callback(server.stop)
                managed[server.url] = server
        errors = [e for e in started if isinstance(e, BaseException)]
        if errors:
            raise errors[0]
        urls = list(managed)
        reporter.say(f"started {len(urls)} vllm serve process(es): {', '.join(urls)}")
    pool = ServerPool(
        urls,
        i,
        managed=managed,
        health_interval_s=i.health_interval_s,
        reconnect_timeout_s=i.reconnect_timeout_s,
        max_restarts=i.max_restarts,
    )
    return await stack.enter_async_context(pool), pool


def weights_dir(configured: str) -> Path | None:
    """A folder of our own inside inference.weights_dir (the publisher removes only it)."""
    if not configured:
        return None
    Path(configured).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="agentrl-weights-", dir=configured))

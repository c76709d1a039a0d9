"""``RolloutController``: one weight update without losing or mislabelling any work.

The protocol, for one version bump (policy ``resume``, the default):

1. close the admission gate: no new generation call starts (episodes keep stepping
   their envs and tools, and wait at the gate when they next need the engine);
2. abort every generation in flight; each hands back the tokens and logprobs it had
   sampled, all stamped with the old version, and its episode parks at the gate;
3. write every parked episode to the store (one transaction) and wait until it is
   durable;
4. reload the weights into vLLM (full weights or a LoRA adapter) and reset the prefix
   cache; the engine's version becomes ``v + 1``;
5. open the gate: each parked episode re-submits its exact token prefix (the KV cache
   is recomputed under the new weights) and its new tokens carry ``v + 1``.

Other policies:

* ``keep``: vLLM's pause in ``keep`` mode. Requests in flight are frozen inside the
  engine, the weights change under them, and they continue. Fastest (no abort, no
  re-prefill), and every token's version is still exact (vLLM labels each output
  token with the weights that sampled it), but the tokens sampled after the update
  attend to keys and values computed by the *old* weights: they come from a mixture
  of the two policies, which the importance weights do not describe. Use it when
  updates are small and throughput matters more than an exact behaviour policy.
* ``drop``: like ``resume``, but a parked episode whose oldest sampled token would be
  more than ``max_staleness`` versions behind after the update is discarded and run
  again from the start (its tokens count as discarded); the rule is
  :meth:`~agentrl.rollout.staleness.Staleness.too_stale`.

Every update records, in the metrics and the store's version history: the
pause-to-resume time, episodes paused, requests aborted, tokens re-prefilled, tokens
discarded and the time to write the checkpoints.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Literal

from agentrl.errors import ConfigError
from agentrl.protocols import UpdateStats
from agentrl.rollout.base import Runner
from agentrl.rollout.staleness import Staleness
from agentrl.runtime import faults
from agentrl.runtime.metrics import Metrics
from agentrl.store import StoreWriter
from agentrl.types import RequestId

UpdatePolicy = Literal["resume", "keep", "drop"]
POLICIES = ("resume", "keep", "drop")


class RolloutController:
    """Runs weight updates around a live :class:`~agentrl.rollout.base.Runner`.

    Implements :class:`~agentrl.protocols.WeightSync`, the only thing the trainer sees
    of it.

    Args:
        runner: the runner whose episodes are paused (through its admission gate).
        writer: where paused episodes are checkpointed (None: no durable checkpoint).
        policy: ``resume``, ``keep`` or ``drop`` (see the module docs).
        max_staleness: with ``drop``, how many versions behind an episode may fall.
    """

    def __init__(
        self,
        runner: Runner,
        *,
        writer: StoreWriter | None = None,
        policy: UpdatePolicy = "resume",
        max_staleness: int | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ConfigError(f"rollout.update_policy is {policy!r}; use one of {POLICIES}")
        if policy == "drop" and (max_staleness is None or max_staleness < 0):
            raise ConfigError(
                f"rollout.update_policy = 'drop' needs max_staleness >= 0, got {max_staleness}"
            )
        self.runner = runner
        self.writer = writer
        self.policy = policy
        self.max_staleness = max_staleness
        self.staleness = Staleness(max_staleness)
        self.metrics = metrics or runner.metrics
        self.admission = runner.admission
        self.history: list[UpdateStats] = []
        self._lock = asyncio.Lock()
        self._push: Callable[[], Any] | None = None

    @property
    def client(self) -> Any:
        return self.runner.client

    async def update_weights(
        self,
        weights_dir: str | None = None,
        *,
        lora_dir: str | None = None,
        push: Callable[[], Any] | None = None,
        version: int | None = None,
    ) -> UpdateStats:
        """Publish new weights: a safetensors folder, a peft adapter folder, or ``push``
        (a blocking function that streams them in, e.g. over NCCL).

        Returns the cost of the update. Raises WeightSyncError when the engine refused
        the weights; the gate is reopened and paused episodes continue on the old
        weights, their checkpoints already durable.
        """
        if sum(x is not None for x in (weights_dir, lora_dir, push)) != 1:
            raise ValueError("give exactly one of weights_dir, lora_dir and push")
        async with self._lock:
            self._push = push
            if self.policy == "keep":
                return await self._update_keep(weights_dir, lora_dir, version)
            return await self._update_paused(weights_dir, lora_dir, version)

    async def _reload(
        self, weights_dir: str | None, lora_dir: str | None, version: int | None, keep: bool
    ) -> int:
        faults.point("weight_update")
        if self._push is not None:
            return await self.client.push_weights(self._push, version, keep_inflight=keep)
        if weights_dir is not None:
            return await self.client.reload_weights(weights_dir, version, keep_inflight=keep)
        return await self.client.load_lora_adapter(lora_dir, version, keep_inflight=keep)

    def _kind(self, weights_dir: str | None) -> str:
        return "push" if self._push is not None else "full" if weights_dir else "lora"

    async def _update_keep(
        self, weights_dir: str | None, lora_dir: str | None, version: int | None
    ) -> UpdateStats:
        t0 = time.perf_counter()
        self.admission.clear()
        frozen = len(self.client.requests)
        try:
            new_version = await self._reload(weights_dir, lora_dir, version, keep=True)
        finally:
            self.admission.set()
        elapsed = time.perf_counter() - t0
        stats = UpdateStats(
            new_version,
            "keep",
            str(weights_dir or lora_dir or "push"),
            elapsed,
            elapsed,
            0.0,
            frozen,
            0,
            0,
            0,
            0,
        )
        return await self._record(stats, self._kind(weights_dir))

    async def _update_paused(
        self, weights_dir: str | None, lora_dir: str | None, version: int | None
    ) -> UpdateStats:
        runner, client = self.runner, self.client
        t0 = time.perf_counter()
        self.admission.clear()
        try:
            ids = client.requests.ids()
            results = await asyncio.gather(*(client.abort(rid) for rid in ids))
            aborted = {
                RequestId.parse(rid).episode_id
                for rid, gen in zip(ids, results, strict=True)
                if gen is not None and gen.finish_reason == "abort"
            }
            await runner.wait_parked(aborted)
            next_version = client.version + 1 if version is None else version
            parked = list(runner.parked)
            dropped, discarded = [], 0
            if self.policy == "drop":
                for episode_id in parked:
                    oldest = runner.oldest_version(episode_id)
                    if self.staleness.too_stale(oldest, next_version):
                        discarded += runner.drop(
                            episode_id,
                            f"oldest token at version {oldest}, more than max_staleness="
                            f"{self.max_staleness} behind version {next_version}",
                        )
                        dropped.append(episode_id)
            kept = [e for e in parked if e not in dropped]
            t_write = time.perf_counter()
            if self.writer is not None:
                for episode_id in kept:
                    self.writer.partial(runner.snapshot(episode_id))
                await self.writer.flush()
            store_write_s = time.perf_counter() - t_write
            reprefill = sum(runner.prefix_tokens(e) for e in kept)
            t_reload = time.perf_counter()
            new_version = await self._reload(weights_dir, lora_dir, version, keep=False)
            reload_s = time.perf_counter() - t_reload
        finally:
            self.admission.set()
        stats = UpdateStats(
            version=new_version,
            policy=self.policy,
            source=str(weights_dir or lora_dir or "push"),
            pause_to_resume_s=time.perf_counter() - t0,
            reload_s=reload_s,
            store_write_s=store_write_s,
            episodes_paused=len(parked),
            requests_aborted=len(aborted),
            tokens_reprefilled=reprefill,
            tokens_discarded=discarded,
            episodes_dropped=len(dropped),
        )
        if kept:
            self.metrics.observe("store_write_per_paused_episode_s", store_write_s / len(kept))
        return await self._record(stats, self._kind(weights_dir))

    async def _record(self, stats: UpdateStats, kind: str) -> UpdateStats:
        self.history.append(stats)
        m = self.metrics
        m.count("weight_updates")
        m.observe("update/pause_to_resume_s", stats.pause_to_resume_s)
        m.count("update/episodes_paused", stats.episodes_paused)
        m.count("update/tokens_reprefilled", stats.tokens_reprefilled)
        m.count("update/tokens_discarded", stats.tokens_discarded)
        m.gauge("policy_version", stats.version)
        if self.writer is not None:
            self.writer.version(stats.version, kind, stats.source, stats.as_dict())
            await self.writer.flush()
        return stats

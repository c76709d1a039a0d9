"""``VLLMClientBase``: what the in-process and the HTTP vLLM clients share.

Owns the state every vLLM client keeps (its config, the version it serves, its running
requests, the lock that serialises weight updates, whether it is closed) and the parts
of the :class:`~agentrl.inference.base.InferenceClient` protocol that do not depend on
how vLLM is reached:

* :meth:`VLLMClientBase.abort`: mark the request, make vLLM stop it, hand back what it
  had sampled;
* :meth:`VLLMClientBase._update`: one weight update and its version bump (pause, load,
  reset the prefix cache, label the weights, bump the version, resume), one at a time.

Not here: sending and streaming requests, and the engine calls themselves. Each client
fills in the hooks (:meth:`~VLLMClientBase._stop`, :meth:`~VLLMClientBase._pause`,
:meth:`~VLLMClientBase._resume`, :meth:`~VLLMClientBase._reset_prefix_cache`,
:meth:`~VLLMClientBase._label_weights`): :class:`~agentrl.inference.engine.VLLMEngineClient`
with ``AsyncLLM`` calls, :class:`~agentrl.inference.server.VLLMServerClient` with
``vllm serve``'s dev-mode routes.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Awaitable, Callable
from typing import Self

from agentrl.errors import WeightSyncError
from agentrl.inference.base import Generation, InferenceConfig, InflightRequests

__all__ = ["VLLMClientBase"]


class VLLMClientBase(abc.ABC):
    """The shared half of a vLLM client: version, requests in flight, abort, updates.

    Args:
        config: the engine settings (request deadline, context window).
    """

    def __init__(self, config: InferenceConfig) -> None:
        self.config = config
        self._version = 0
        self._inflight = InflightRequests()
        self._update_lock = asyncio.Lock()
        self._closed = False

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def version(self) -> int:
        """The policy version new requests are served with."""
        return self._version

    @property
    def max_model_len(self) -> int:
        """The context window: prompt plus sampled tokens never exceed it."""
        return self.config.max_model_len

    @property
    def requests(self) -> InflightRequests:
        """The running requests and what each has sampled so far."""
        return self._inflight

    async def abort(self, request_id: str) -> Generation | None:
        """Abort a request; return what it had produced, or None if it was not running."""
        done = self._inflight.completion(request_id)
        if done is None:
            return None
        self._inflight.aborted.add(request_id)
        await self._stop(request_id)
        try:
            return await asyncio.shield(done)
        except Exception:
            return None

    @abc.abstractmethod
    async def close(self) -> None:
        """Abort everything in flight and shut the engine down. Safe to call twice."""

    async def _update(
        self,
        action: str,
        load: Callable[[int], Awaitable[None]],
        version: int | None,
        keep_inflight: bool,
        finish: Callable[[int], Awaitable[None]] | None = None,
    ) -> int:
        """One weight update; return the new version (``version``, or the current + 1).

        With vLLM paused (``keep`` mode when ``keep_inflight``, else ``wait``): ``load``
        the weights labelled with the new version, reset the prefix cache, label the
        engine's weights, ``finish`` (e.g. switch to the new adapter), and only then
        count the new version; vLLM resumes whatever happened.

        Raises:
            WeightSyncError: a step failed (``action`` names the update); the version
                stays where it was.
        """
        async with self._update_lock:
            new_version = self._version + 1 if version is None else version
            try:
                await self._pause(keep_inflight)
                try:
                    await load(new_version)
                    # With frozen requests holding blocks this may not clear everything.
                    await self._reset_prefix_cache()
                    await self._label_weights(new_version)
                    if finish is not None:
                        await finish(new_version)
                    self._version = new_version
                finally:
                    await self._resume()
            except Exception as e:
                raise WeightSyncError(f"{action} failed: {e}") from e
        return new_version

    # -- what each client does its own way -------------------------------------------------

    @abc.abstractmethod
    async def _stop(self, request_id: str) -> None:
        """Make vLLM end a running request (its ``generate`` call then returns)."""

    @abc.abstractmethod
    async def _pause(self, keep_inflight: bool) -> None:
        """Pause vLLM: freeze requests in flight (``keep``) or let them finish (``wait``)."""

    @abc.abstractmethod
    async def _resume(self) -> None:
        """Resume vLLM after :meth:`_pause`."""

    @abc.abstractmethod
    async def _reset_prefix_cache(self) -> None:
        """Drop cached KV blocks (computed by the old weights)."""

    @abc.abstractmethod
    async def _label_weights(self, version: int) -> None:
        """Tell vLLM the version of its weights (it labels each sampled token with it)."""

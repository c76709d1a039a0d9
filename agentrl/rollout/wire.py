"""The rollout workers' wire: what crosses between the main process and a worker.

Two OS pipes per worker carry length-prefixed pickles (:class:`Channel`), read and
written by each side's event loop; messages sent in one pass of the loop go out as one
batch (writes are buffered: neither side ever blocks on the other). This module owns
the channel, the values that cross it (:class:`WorkerSpec`, a generation as its fields,
an error as a payload) and the prompt encoding (:class:`PromptsSent`,
:class:`PromptsReceived`): a generation request carries the episode's prompt as what
it adds to the episode's previous one where it extends it. Every turn's prompt holds
the whole conversation, and pickling it both ways grew with the context (146 us a turn
at 5,000 tokens).

It does not own either side: the worker process is :mod:`agentrl.rollout.worker_process`,
the main process's side :mod:`agentrl.rollout.workers`.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import operator
import os
import pickle
from collections.abc import Sequence
from typing import Any

from agentrl.config import EnvConfig, ModelConfig, RolloutConfig
from agentrl.errors import ContextOverflowError, InfraError
from agentrl.inference.base import Generation
from agentrl.rollout.episode import EpisodeDropped

logger = logging.getLogger(__name__)

_HEADER = 8

_GENERATION_FIELDS = tuple(f.name for f in dataclasses.fields(Generation))
"""A generation crosses as ``(None, *these fields)``: cheaper than pickling the object."""
generation_values = operator.attrgetter(*_GENERATION_FIELDS)


def generation_from(values: Sequence[Any]) -> Generation:
    """The generation whose fields crossed as ``values``, not checked again: it was
    checked where the main process's client made it (2.7 -> 1.1 us a turn)."""
    gen = object.__new__(Generation)
    for name, value in zip(_GENERATION_FIELDS, values, strict=True):
        object.__setattr__(gen, name, value)
    return gen


class Channel:
    """Length-prefixed pickles over a pair of pipes, on the running event loop.

    Messages sent in one pass of the loop go out as one pickled batch in one write (a
    turn sends two to four; a write and the wake-up it causes on the other side cost
    more than pickling a message), in the order they were sent; :meth:`recv` hands them
    out one by one.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._out: list[tuple[Any, ...]] = []
        self._in: collections.deque[tuple[Any, ...]] = collections.deque()

    @classmethod
    async def open(cls, read_fd: int, write_fd: int) -> Channel:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=2**31)
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", buffering=0)
        )
        transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, os.fdopen(write_fd, "wb", buffering=0)
        )
        writer = asyncio.StreamWriter(transport, protocol, None, loop)
        return cls(reader, writer)

    def send(self, message: tuple[Any, ...]) -> None:
        """Queue ``message``; it is written at the end of this pass of the loop."""
        if self.writer.is_closing():
            return
        self._out.append(message)
        if len(self._out) == 1:
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Write the queued messages now (one batch)."""
        out, self._out = self._out, []
        if not out or self.writer.is_closing():
            return
        data = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
        self.writer.write(len(data).to_bytes(_HEADER, "little") + data)

    async def drain(self) -> None:
        """Write the queued messages and wait until the pipe took them."""
        self.flush()
        await self.writer.drain()

    async def recv(self) -> tuple[Any, ...]:
        """The next message; raises ``asyncio.IncompleteReadError`` when the other side is gone."""
        if not self._in:
            size = int.from_bytes(await self.reader.readexactly(_HEADER), "little")
            self._in.extend(pickle.loads(await self.reader.readexactly(size)))
        return self._in.popleft()

    def close(self) -> None:
        """Write what is queued, then close (the other side may be gone already)."""
        try:
            self.flush()
        except (OSError, RuntimeError) as e:  # a pipe the other side closed: nothing to tell
            logger.debug("rollout worker channel: %s: %s while closing", type(e).__name__, e)
        finally:
            self.writer.close()


# -- what crosses the wire ---------------------------------------------------------------


Target = tuple[str, int] | None
"""Where an env server runs now (host, port), or None while it is down."""


@dataclasses.dataclass(frozen=True)
class EnvServers:
    """The run's env servers as a worker reaches them (``[env] url``/``urls``).

    Each worker opens its own :class:`~agentrl.remote.pool.EnvServerPool` of
    ``config.servers``. With ``targets`` (servers that may move: Ray actors, whose
    addresses in ``config`` are relays in the main process, unreachable from another
    node), the worker puts a relay of its own in front of each server instead, aimed at
    ``targets[i]`` and re-aimed by an ``("env_targets", targets)`` message.
    """

    config: EnvConfig
    targets: tuple[Target, ...] | None = None


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to build its runner (sent once, pickled)."""

    index: int
    tokenizer: Any
    rollout: RolloutConfig
    model: ModelConfig | None
    imports: tuple[str, ...]
    sys_path: tuple[str, ...]
    max_model_len: int
    version: int
    env_servers: EnvServers | None = None
    """None: the envs are made in the worker (Gymnasium's registry)."""


def error_payload(e: BaseException) -> tuple[Any, ...]:
    if isinstance(e, EpisodeDropped):
        return ("dropped", e.reason, e.tokens_discarded)
    if isinstance(e, ContextOverflowError):
        return ("overflow", e.prompt_tokens, e.max_model_len)
    if isinstance(e, InfraError):
        return ("infra", str(e))
    return ("other", f"{type(e).__name__}: {e}")


def error_from(payload: tuple[Any, ...], where: str, episode_id: str = "") -> BaseException:
    kind = payload[0]
    if kind == "dropped":
        return EpisodeDropped(episode_id, payload[1], payload[2])
    if kind == "overflow":
        return ContextOverflowError(payload[1], payload[2])
    if kind == "infra":
        return InfraError(payload[1])
    return InfraError(f"{where} raised {payload[1]}")


# -- prompts: each as what it adds to the episode's previous one --------------------------


PromptPayload = list[int] | tuple[int, int, list[int]]
"""A prompt on the wire: whole, or ``(n, k, tail)`` (see :class:`PromptsSent`)."""


class PromptsSent:
    """The worker's side: the last prompt sent for each running episode.

    A turn's prompt is the conversation so far, the previous turn's prompt plus what came
    since (the sampled turn, the env's reply). It is sent as ``(n, k, tail)``: the first
    ``k`` tokens are those of the prompt of request ``n``, ``tail`` follows. Whether it
    extends that prompt is checked token for token (a comparison in C: 5 us at 5,000
    tokens, against 49 us to pickle them and 73 to unpickle); a prompt that does not (a
    new template segment, a cut-off turn dropped) goes whole.
    """

    def __init__(self) -> None:
        self._last: dict[str, tuple[int, list[int]]] = {}

    def payload(self, episode_id: str, n: int, prompt: list[int]) -> PromptPayload:
        """What request ``n`` of ``episode_id`` sends for ``prompt`` (kept: not to be changed)."""
        last = self._last.get(episode_id)
        self._last[episode_id] = (n, prompt)
        if last is not None:
            base, tokens = last
            k = len(tokens)
            if len(prompt) >= k and prompt[:k] == tokens:
                return (base, k, prompt[k:])
        return prompt

    def forget(self, episode_id: str) -> None:
        """The episode ended (a retry or a resume starts with a whole prompt)."""
        self._last.pop(episode_id, None)

    def __len__(self) -> int:
        return len(self._last)


class PromptsReceived:
    """The main process's side: the last prompt each worker sent for each episode."""

    def __init__(self) -> None:
        self._last: dict[tuple[int, str], tuple[int, list[int]]] = {}

    def prompt(self, key: tuple[int, str], n: int, payload: PromptPayload) -> list[int]:
        """The whole prompt of request ``n`` (``key``: the worker's index, the episode).

        Raises:
            InfraError: the payload extends a prompt this side does not hold (the two
                sides disagree: a bug, never a wrong prompt sent to the engine).
        """
        if isinstance(payload, tuple):
            base, k, tail = payload
            last = self._last.get(key)
            if last is None or last[0] != base or len(last[1]) != k:
                raise InfraError(
                    f"rollout worker {key[0]} sent episode {key[1]!r}'s prompt as an "
                    f"extension of request {base} ({k} tokens), which the main process does "
                    f"not hold ({'nothing' if last is None else f'request {last[0]}'}): the "
                    "two sides disagree; please report this with the run's log"
                )
            prompt = last[1] + tail
        else:
            prompt = payload
        self._last[key] = (n, prompt)
        return prompt

    def forget(self, key: tuple[int, str]) -> None:
        self._last.pop(key, None)

    def __len__(self) -> int:
        return len(self._last)

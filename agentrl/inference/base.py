"""The seam between agentrl and an inference engine: tokens in, tokens out.

Owns the :class:`InferenceClient` protocol, the values that cross it
(:class:`SamplingConfig`, :class:`Generation`), the engine settings
(:class:`InferenceConfig`), and the in-flight bookkeeping both vLLM clients share
(:class:`InflightRequests`; callers see it as :class:`InflightView`). The vLLM
clients' shared machinery lives in :mod:`agentrl.inference.client_base`. Never renders
text or runs env logic.

Every generation is in token ids: a prompt goes in as ids, the sampled ids come back
with one behaviour logprob each and the policy version that served them. Nothing
here tokenizes or detokenizes model output, so nothing downstream can drift.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Literal, Protocol, Self, runtime_checkable

from agentrl.config import InferenceConfig
from agentrl.errors import ContextOverflowError

__all__ = [
    "FinishReason",
    "Generation",
    "InferenceClient",
    "InferenceConfig",
    "InflightView",
    "SamplingConfig",
]

FinishReason = Literal["stop", "length", "abort"]


STREAM_INTERVAL = 16
"""Sampled tokens vLLM gathers into each streamed output of a request (its first and last
outputs come at once), in both clients: the in-process engine's (``SamplingParams``) and
``vllm serve``'s (the request's ``stream_interval``). Every output costs this process,
beside the episode loop, a pass of the loop and (in-process) a ``RequestOutput`` or
(served) a JSON chunk to read. What it changes: a running request's token count
(``requests.sampled``, ``wait_for_tokens``) moves in steps of this many. An abort keeps
every token the client was sent: in-process that is every token sampled (vLLM's final
output carries those not sent yet); served, the stream is closed, and up to this many
tokens the server sampled but had not sent are not kept (the episode goes on from the
tokens it holds, an exact prefix, so only their sampling is repeated)."""


@dataclasses.dataclass(frozen=True, slots=True)
class SamplingConfig:
    """Sampling parameters for one generation call."""

    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    """-1 (or 0) disables top-k."""
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    """Extra token ids that end the turn (the model's EOS always does)."""
    ignore_eos: bool = False
    """Sample exactly max_tokens (benchmarks: fixed output lengths)."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclasses.dataclass(frozen=True, slots=True)
class Generation:
    """What one generation call produced.

    Attributes:
        request_id: the id the caller gave.
        token_ids: sampled token ids, exactly as the engine returned them.
        logprobs: behaviour-policy logprob of each sampled token (same length).
        finish_reason: ``stop`` (EOS or a stop token), ``length`` (max_tokens or the
            context window), or ``abort`` (aborted; the tokens are a valid prefix).
        version: the policy version when the request was admitted.
        prompt_tokens: length of the prompt.
        versions: the policy version that sampled each token (same length as
            ``token_ids``; never decreasing). Equal to ``version`` everywhere unless
            weights changed while the request was running.
    """

    request_id: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    version: int
    prompt_tokens: int
    versions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.versions and self.token_ids:
            object.__setattr__(self, "versions", (self.version,) * len(self.token_ids))
        if len(self.versions) != len(self.token_ids):
            raise ValueError(
                f"generation {self.request_id!r}: {len(self.token_ids)} token ids but "
                f"{len(self.versions)} versions; every sampled token needs one version"
            )
        # The usual case (one version throughout, no NaN or positive logprob) is checked
        # in C; the per-token scans below run only to say what is wrong.
        versions = self.versions
        if (
            len(versions) > 1
            and min(versions) != max(versions)
            and any(b < a for a, b in itertools.pairwise(versions))
        ):
            raise ValueError(
                f"generation {self.request_id!r}: versions decrease along the sequence: "
                f"{self.versions}"
            )
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"generation {self.request_id!r}: {len(self.token_ids)} token ids but "
                f"{len(self.logprobs)} logprobs; every sampled token needs one logprob"
            )
        logprobs = self.logprobs
        if len(logprobs) == 0 or (not math.isnan(sum(logprobs)) and max(logprobs) <= 1e-4):
            return
        bad = [i for i, lp in enumerate(logprobs) if math.isnan(lp) or lp > 1e-4]
        if bad:
            raise ValueError(
                f"generation {self.request_id!r}: logprobs at positions {bad[:5]} are NaN or "
                f"positive: {[self.logprobs[i] for i in bad[:5]]}"
            )


class InflightView(Protocol):
    """What a client shows of its running requests (``InferenceClient.requests``).

    Implemented by :class:`InflightRequests` (one vLLM engine or server) and by the
    server pool's view over its servers.
    """

    def __len__(self) -> int:
        """How many requests are running (or, in a pool, waiting for a server)."""
        ...

    def ids(self) -> list[str]:
        """The ids of the running requests, in the order they started."""
        ...

    def sampled(self, request_id: str) -> int:
        """Tokens sampled so far by a running request (0 if it is not running)."""
        ...

    async def wait_for_tokens(self, request_id: str, n: int) -> int:
        """Wait until a running request has sampled ``n`` tokens or has ended.

        Returns the number sampled at that moment.

        Raises:
            KeyError: the request is not running.
        """
        ...


@runtime_checkable
class InferenceClient(Protocol):
    """An inference engine that works in token ids and knows its policy version.

    Everything a caller (the runner, the rollout controller, the CLI) may use; the three
    implementations (:class:`~agentrl.inference.engine.VLLMEngineClient`,
    :class:`~agentrl.inference.server.VLLMServerClient`,
    :class:`~agentrl.inference.pool.ServerPool`) have each member with the same
    signature. Use as ``async with client:``; leaving the block closes it.
    """

    @property
    def version(self) -> int:
        """The policy version new requests are served with."""
        ...

    @property
    def max_model_len(self) -> int:
        """The context window: prompt plus sampled tokens never exceed it."""
        ...

    @property
    def requests(self) -> InflightView:
        """The requests in flight and what each has sampled so far."""
        ...

    async def generate(
        self, prompt_token_ids: Sequence[int], sampling: SamplingConfig, request_id: str
    ) -> Generation:
        """Sample a continuation of ``prompt_token_ids``.

        An aborted request returns normally with ``finish_reason == "abort"`` and the
        tokens it had produced.

        Raises:
            ContextOverflowError: the prompt leaves no room for one sampled token.
            EngineError: the engine failed, or the client is closed.
        """
        ...

    async def abort(self, request_id: str) -> Generation | None:
        """Abort a request; return what it had produced, or None if it was not running."""
        ...

    async def reload_weights(
        self, weights_dir: str, version: int | None = None, *, keep_inflight: bool = False
    ) -> int:
        """Load full weights (safetensors in ``weights_dir``); return the new version.

        ``version``: the label of the new weights (default: the current version + 1).
        Requests in flight finish under the old weights first, unless ``keep_inflight``
        freezes them and continues them under the new weights (KV from the old ones).

        Raises:
            WeightSyncError: the engine refused the weights; it serves the old ones.
        """
        ...

    async def load_lora_adapter(
        self, adapter_dir: str, version: int | None = None, *, keep_inflight: bool = False
    ) -> int:
        """Serve every later request with this peft adapter; return the new version.

        Raises:
            WeightSyncError: the engine refused the adapter (or was started without LoRA).
        """
        ...

    async def push_weights(
        self,
        send: Callable[[], object],
        version: int | None = None,
        *,
        keep_inflight: bool = False,
    ) -> int:
        """Load weights that the blocking ``send`` streams in (NCCL); return the new version.

        ``send`` runs in a worker thread while the engine is paused.

        Raises:
            WeightSyncError: the client has no weight-transfer backend (only the
                in-process engine started with ``inference.weight_transfer`` has one),
                or the transfer failed.
        """
        ...

    async def close(self) -> None:
        """Abort everything in flight and shut the engine down. Safe to call twice."""
        ...

    async def __aenter__(self) -> Self:
        """The client itself."""
        ...

    async def __aexit__(self, *exc: object) -> None:
        """:meth:`close` it."""
        ...


_INT = {int}


def token_list(prompt_token_ids: Sequence[int]) -> list[int]:
    """A prompt's ids as a new list of Python ints (what the engines take), from any
    sequence of integers (numpy's included).

    A prompt holds the whole conversation and is sent again every turn: converting each
    id with ``int()`` cost 54 ns a token here (271 us a turn at 5,000 tokens), while the
    rollout loop's prompts are already lists of ints. Those are copied after checking the
    type of every element in C (19 ns a token); anything else is converted as before.
    """
    ids = list(prompt_token_ids)
    if set(map(type, ids)) <= _INT:
        return ids
    return [int(t) for t in ids]


def clamp_max_tokens(prompt_len: int, sampling: SamplingConfig, max_model_len: int) -> int:
    """Fit ``max_tokens`` into the context window, or raise if nothing fits."""
    room = max_model_len - prompt_len
    if room < 1:
        raise ContextOverflowError(prompt_len, max_model_len)
    return min(sampling.max_tokens, room)


class InflightRequests:
    """Partial outputs of running requests, so an abort can hand them back.

    Each vLLM client appends sampled tokens as they stream in; ``abort`` marks the
    request and waits for its ``generate`` call to finish with the partial result.
    """

    def __init__(self) -> None:
        self._tokens: dict[str, list[int]] = {}
        self._logprobs: dict[str, list[float]] = {}
        self._done: dict[str, asyncio.Future[Generation]] = {}
        self._waiters: dict[str, list[tuple[int, asyncio.Future[None]]]] = {}
        self.aborted: set[str] = set()

    def __len__(self) -> int:
        return len(self._done)

    def ids(self) -> list[str]:
        return list(self._done)

    def start(self, request_id: str) -> None:
        if request_id in self._done:
            raise ValueError(f"request id {request_id!r} is already in flight; ids must be unique")
        self._tokens[request_id] = []
        self._logprobs[request_id] = []
        self._done[request_id] = asyncio.get_running_loop().create_future()

    def extend(self, request_id: str, token_ids: Sequence[int], logprobs: Sequence[float]) -> None:
        if len(token_ids) != len(logprobs):
            raise ValueError(
                f"request {request_id!r}: engine returned {len(token_ids)} tokens but "
                f"{len(logprobs)} logprobs"
            )
        tokens = self._tokens[request_id]
        tokens.extend(token_ids)
        self._logprobs[request_id].extend(logprobs)
        if request_id in self._waiters:
            self._wake(request_id, len(tokens))

    def sampled(self, request_id: str) -> int:
        """Tokens sampled so far by a running request (0 if it is not running)."""
        return len(self._tokens.get(request_id, ()))

    async def wait_for_tokens(self, request_id: str, n: int) -> int:
        """Wait until a running request has sampled ``n`` tokens or has ended.

        Returns the number sampled at that moment (the final count if it ended first).
        """
        if request_id not in self._done:
            raise KeyError(f"request {request_id!r} is not in flight")
        if self.sampled(request_id) < n:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(request_id, []).append((n, waiter))
            await waiter
        return self.sampled(request_id)

    def _wake(self, request_id: str, have: int | None) -> None:
        pending = []
        for n, waiter in self._waiters.pop(request_id, []):
            if have is None or have >= n:
                if not waiter.done():
                    waiter.set_result(None)
            else:
                pending.append((n, waiter))
        if pending:
            self._waiters[request_id] = pending

    def finish(
        self,
        request_id: str,
        finish_reason: FinishReason,
        version: int,
        prompt_tokens: int,
        versions: Sequence[int] | None = None,
    ) -> Generation:
        if request_id in self.aborted:
            finish_reason = "abort"
        tokens = self._tokens.pop(request_id)
        if versions is not None and len(versions) != len(tokens):
            versions = None  # the engine's labels do not cover these tokens; fall back
        result = Generation(
            request_id=request_id,
            token_ids=tuple(tokens),
            logprobs=tuple(self._logprobs.pop(request_id)),
            finish_reason=finish_reason,
            version=version,
            prompt_tokens=prompt_tokens,
            versions=tuple(versions) if versions is not None else (),
        )
        self.aborted.discard(request_id)
        self._wake(request_id, None)
        done = self._done.pop(request_id)
        if not done.done():
            done.set_result(result)
        return result

    def fail(self, request_id: str, error: BaseException) -> None:
        self._tokens.pop(request_id, None)
        self._logprobs.pop(request_id, None)
        self.aborted.discard(request_id)
        self._wake(request_id, None)
        done = self._done.pop(request_id, None)
        if done is not None and not done.done():
            done.set_exception(error)
            done.exception()  # mark retrieved: the generate() caller gets the error

    def completion(self, request_id: str) -> asyncio.Future[Generation] | None:
        return self._done.get(request_id)

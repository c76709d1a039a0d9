"""A scripted inference client: fast, deterministic, for unit tests of the rollout loop.

The seam itself (real vLLM) is tested in test_vllm_rollout.py; this fake only makes
the fault and invariant tests fast.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.errors import ContextOverflowError
from agentrl.inference.base import Generation, SamplingConfig


class ScriptedClient:
    """Replies with ``reply(prompt_ids) -> text``, tokenized, ending with <|im_end|>."""

    def __init__(
        self, tokenizer: Any, reply: Callable[[Sequence[int]], str], max_model_len: int = 512
    ) -> None:
        self.tokenizer = tokenizer
        self.reply = reply
        self._max_model_len = max_model_len
        self.version = 0
        self.in_flight: set[str] = set()
        self.calls: list[tuple[list[int], Generation]] = []
        self.eot = tokenizer.convert_tokens_to_ids("<|im_end|>")

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    async def generate(
        self, prompt_token_ids: Sequence[int], sampling: SamplingConfig, request_id: str
    ) -> Generation:
        if len(prompt_token_ids) >= self._max_model_len:
            raise ContextOverflowError(len(prompt_token_ids), self._max_model_len)
        self.in_flight.add(request_id)
        try:
            await asyncio.sleep(0.001)
            ids = [*self.tokenizer.encode(self.reply(prompt_token_ids)), self.eot]
            finish = "stop"
            if len(ids) > sampling.max_tokens:
                ids, finish = ids[: sampling.max_tokens], "length"
            gen = Generation(
                request_id,
                tuple(ids),
                tuple(-0.25 for _ in ids),
                finish,
                self.version,
                len(prompt_token_ids),
            )
            self.calls.append((list(prompt_token_ids), gen))
            return gen
        finally:
            self.in_flight.discard(request_id)

"""Thinking: separating a turn's reasoning from its answer, with vLLM's reasoning parsers.

Thinking models (Qwen3, DeepSeek-R1 and their distills) write ``<think>...</think>``
before the answer. The env and the tool parser see only the answer; the token record
keeps every sampled token, thinking included (it was sampled, so it is trained), and
the assistant message keeps the whole text (the family's template decides what of it to
render later). :class:`ReasoningFormat` hands the text to the parser vLLM ships
(``vllm.reasoning.ReasoningParserManager``, the names of ``vllm serve
--reasoning-parser``) and follows its rules: for ``qwen3``, a turn that never closes
``</think>`` is all thinking and has no answer.

Templates that drop past thinking from the history (Qwen3 drops it at every new user
turn) are not prefix preserving: the runner starts a new segment there and re-prefills
the whole conversation. ``model.keep_thinking`` keeps the sampled turns instead (see
:meth:`agentrl.chat.Conversation.delta_for`): no new segment, at the price of a history
the template itself would not render. ``model.chat_template_kwargs`` reaches the parser
as it reaches every rendering: with Qwen3's ``{enable_thinking = false}`` the generation
prompt closes an empty thinking block and the parser reads each turn as all answer. That
does not keep the prefix either (the template writes the empty block for the last turn
only); ``agentrl check-model`` measures both settings.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True, slots=True)
class ReasoningSpec:
    """What agentrl knows of one reasoning format beyond its parser."""

    name: str
    """The vLLM reasoning-parser name (``vllm serve --reasoning-parser NAME``)."""
    families: str
    start: str
    end: str
    signature: tuple[str, ...]
    """A chat template holding all of these writes thinking this way."""


REASONING: dict[str, ReasoningSpec] = {
    s.name: s
    for s in (
        ReasoningSpec(
            "qwen3",
            "Qwen3, QwQ (ChatML with <think>)",
            "<think>",
            "</think>",
            ("</think>", "<|im_start|>"),
        ),
        ReasoningSpec(
            "deepseek_r1", "DeepSeek-R1 and its distills", "<think>", "</think>", ("</think>",)
        ),
    )
}


def detect_reasoning(template: str | None) -> str | None:
    """The reasoning format a chat template handles, or None when it has no thinking."""
    if not template:
        return None
    for spec in REASONING.values():
        if all(s in template for s in spec.signature):
            return spec.name
    return None


def available_reasoning_formats() -> list[str]:
    """Every reasoning-parser name vLLM registers."""
    from vllm.reasoning import ReasoningParserManager

    return ReasoningParserManager.list_registered()


class ReasoningFormat:
    """Splits a turn into thinking and answer with vLLM's reasoning parser.

    Args:
        name: a vLLM reasoning-parser name (``qwen3``, ``deepseek_r1``, ...).
        tokenizer: the model's tokenizer.
        template_kwargs: the chat-template variables of every rendering
            (``model.chat_template_kwargs``); the parser reads them as vLLM's server
            does (Qwen3 with ``enable_thinking = false`` finds no thinking).

    Raises:
        KeyError: vLLM has no reasoning parser of that name.
    """

    def __init__(
        self, name: str, tokenizer: Any, template_kwargs: Mapping[str, Any] | None = None
    ) -> None:
        from vllm.reasoning import ReasoningParserManager

        self.name = name
        parser = ReasoningParserManager.get_reasoning_parser(name)
        self._parser = parser(tokenizer, chat_template_kwargs=dict(template_kwargs or {}))

    def __repr__(self) -> str:
        return f"ReasoningFormat({self.name!r})"

    def split(self, text: str) -> tuple[str, str]:
        """``(thinking, answer)`` of one turn's text (either may be empty)."""
        thinking, answer = self._parser.extract_reasoning(text, _request())
        return (thinking or "").strip("\n"), (answer or "").lstrip("\n")


@functools.lru_cache(maxsize=1)
def _request() -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(messages=[{"role": "user", "content": ""}], model="agentrl")

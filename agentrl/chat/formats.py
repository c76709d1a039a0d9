"""A model's chat format: its tool-call format and its reasoning, chosen once per run.

:func:`resolve_chat_format` turns ``[model] tool_format`` / ``reasoning`` /
``keep_thinking`` and the tokenizer's chat template into a :class:`ChatFormat`, the one
object the runner asks how to read a turn: :meth:`ChatFormat.answer` (the text the env
and the tool parser see, thinking removed) and :attr:`ChatFormat.tools` (the tool-call
parser, None when the template shows no tool calls).

``auto`` reads the chat template (:func:`~agentrl.chat.toolcalls.detect_tool_format`,
:func:`~agentrl.chat.reasoning.detect_reasoning`); a name picks a vLLM parser by hand.
``model.chat_template_kwargs`` goes to every rendering (:attr:`ChatFormat.template_kwargs`,
which the runner hands to each :class:`~agentrl.chat.Conversation`) and to the reasoning
parser, as vLLM's server does with a request's ``chat_template_kwargs``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentrl.chat.conversation import Conversation
from agentrl.chat.reasoning import ReasoningFormat, detect_reasoning
from agentrl.chat.toolcalls import ToolCallFormat, available_tool_formats, detect_tool_format
from agentrl.config import ModelConfig
from agentrl.errors import ConfigError
from agentrl.tools import ParsedTurn, ToolResult, ToolSet
from agentrl.types import Message


@dataclasses.dataclass(frozen=True)
class ChatFormat:
    """How the runner reads a model's turns."""

    tools: ToolCallFormat | None
    """Reads tool calls; None: the template shows no tool-call format."""
    reasoning: ReasoningFormat | None
    """Separates thinking from the answer; None: turns are all answer."""
    keep_thinking: bool = False
    """Keep sampled turns when the template would rewrite them (``model.keep_thinking``)."""
    detected: bool = True
    """Both came from the chat template (``auto``), not from the config."""
    template_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Variables for every rendering of the chat template (``model.chat_template_kwargs``)."""

    def answer(self, text: str) -> str:
        """The part of a turn the env and the tool parser see (thinking removed)."""
        if self.reasoning is None:
            return text
        return self.reasoning.split(text)[1]

    def parse(self, toolset: ToolSet, answer: str, finish_reason: str, turn: int) -> ParsedTurn:
        """The tool calls of a turn's answer (none when the template shows no tool calls:
        then all text is for the env)."""
        if self.tools is None:
            return ParsedTurn((), ())
        return toolset.parse(answer, self.tools, finish_reason=finish_reason, turn=turn)

    def tool_results(
        self, conversation: Conversation, parsed: ParsedTurn, results: Sequence[ToolResult]
    ) -> list[Message]:
        """The messages that take a turn's results back; first gives the assistant
        message its calls where the family's template renders them from ``tool_calls``."""
        assert self.tools is not None  # parsed calls come from it
        turn = conversation.turn - 1
        history_calls = self.tools.history_calls(parsed, turn)
        if history_calls:
            conversation.attach_tool_calls(history_calls)
        return self.tools.result_messages(parsed, results, turn)


def resolve_chat_format(tokenizer: Any, model: ModelConfig | None = None) -> ChatFormat:
    """The chat format of ``tokenizer`` under ``model``'s settings.

    Raises:
        ConfigError: naming ``model.tool_format`` or ``model.reasoning`` when vLLM has
            no parser of that name, or the parser refuses this tokenizer.
    """
    model = model or ModelConfig()
    template = getattr(tokenizer, "chat_template", None)
    template = template if isinstance(template, str) else None
    tool_name = detect_tool_format(template) if model.tool_format == "auto" else model.tool_format
    if model.reasoning == "auto":
        reasoning_name = detect_reasoning(template)
    else:
        reasoning_name = None if model.reasoning == "none" else model.reasoning
    kwargs = dict(model.chat_template_kwargs)
    tools = _build("model.tool_format", tool_name, ToolCallFormat, tokenizer)
    reasoning_format = functools.partial(ReasoningFormat, template_kwargs=kwargs)
    reasoning = _build("model.reasoning", reasoning_name, reasoning_format, tokenizer)
    detected = model.tool_format == "auto" and model.reasoning == "auto"
    return ChatFormat(tools, reasoning, model.keep_thinking, detected, kwargs)  # type: ignore[arg-type]


def _build(key: str, name: str | None, cls: Callable[[str, Any], Any], tokenizer: Any) -> Any:
    if name is None:
        return None
    try:
        return cls(name, tokenizer)
    except KeyError:
        if cls is ToolCallFormat:
            known = ", ".join(available_tool_formats())
        else:
            from agentrl.chat.reasoning import available_reasoning_formats

            known = ", ".join(["none", *available_reasoning_formats()])
        raise ConfigError(
            f"{key} = {name!r} is not a vLLM parser; use auto or one of: {known}"
        ) from None
    except (RuntimeError, ValueError) as e:
        raise ConfigError(
            f"{key} = {name!r} does not fit this model's tokenizer ({e}); use auto, or the "
            f"format of the model's chat template (`agentrl check-model MODEL` shows it)"
        ) from None

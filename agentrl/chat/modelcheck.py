"""``agentrl check-model``: what agentrl finds in a model's chat template, and what it does.

:func:`check_model` reports, for a tokenizer (and the model's ``config.json``):

* the tool-call format and the reasoning parser (detected or configured);
* a round trip: a call rendered by the template is read back by the parser;
* whether the template is prefix preserving over a multi-turn tool conversation (a tool
  turn, an answer, a new user turn), where it breaks, and what the breaks cost (new
  segments, re-prefilled tokens) with and without ``model.keep_thinking``;
* special tokens and end-of-turn tokens, the context length, tied embeddings.

Each :class:`Finding` says what agentrl will do about it. :func:`check_tool_calls` is
the check ``agentrl train`` runs at start: it stops the run when an env with tools meets
a model whose tool calls cannot be parsed.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from agentrl.chat.conversation import Conversation
from agentrl.chat.formats import ChatFormat, resolve_chat_format
from agentrl.chat.reasoning import REASONING, ReasoningSpec
from agentrl.chat.toolcalls import FORMATS
from agentrl.config import EnvConfig, ModelConfig
from agentrl.errors import ConfigError
from agentrl.tools import ToolResult, ToolSet
from agentrl.types import Message

Level = Literal["ok", "note", "warn", "error"]


@dataclasses.dataclass(frozen=True, slots=True)
class Finding:
    """One line of the report: what was found, and what agentrl does about it."""

    topic: str
    level: Level
    found: str
    action: str


@dataclasses.dataclass(frozen=True, slots=True)
class ModelReport:
    model: str
    findings: tuple[Finding, ...]

    @property
    def ok(self) -> bool:
        return all(f.level != "error" for f in self.findings)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


_PROMPT: list[Message] = [
    {"role": "system", "content": "Use the add tool, then answer with 'Answer: N'."},
    {"role": "user", "content": "What is 2 + 3?"},
]
_CALL = {
    "id": "t0000c000",
    "type": "function",
    "function": {"name": "add", "arguments": {"a": 2, "b": 3}},
}


def check_model(
    tokenizer: Any,
    *,
    name: str = "",
    settings: ModelConfig | None = None,
    hf_config: dict[str, Any] | None = None,
) -> ModelReport:
    """Every check on one model (see the module doc); never raises for a finding."""
    settings = settings or ModelConfig()
    if not isinstance(getattr(tokenizer, "chat_template", None), str):
        return ModelReport(
            name,
            (
                Finding(
                    "chat template",
                    "error",
                    "none",
                    "agentrl renders every turn with it: use an instruct/chat model",
                ),
            ),
        )
    try:
        chat = resolve_chat_format(tokenizer, settings)
    except ConfigError as e:
        return ModelReport(name, (Finding("tool format", "error", str(e), "fix the setting"),))
    findings = [*_formats(chat), _round_trip(tokenizer, chat)]
    findings += _prefix(tokenizer, settings)
    findings += [_special_tokens(tokenizer, chat), *_config_findings(tokenizer, hf_config or {})]
    return ModelReport(name, tuple(findings))


def _formats(chat: ChatFormat) -> list[Finding]:
    how = "detected from the chat template" if chat.detected else "set in [model]"
    if chat.tools is None:
        tools = Finding(
            "tool format",
            "warn",
            f"none ({how})",
            "no tool calls are read: all text goes to the env; an env with "
            "tools stops `agentrl train` (set model.tool_format)",
        )
    else:
        spec = FORMATS.get(chat.tools.name)
        families = f" - {spec.families}" if spec else ""
        tools = Finding(
            "tool format",
            "ok",
            f"{chat.tools.name}{families} ({how})",
            f"calls are read by vLLM's `{chat.tools.name}` tool parser; "
            "failures count as malformed_json, cut_off, unknown_tool, "
            "bad_arguments",
        )
    if chat.reasoning is None:
        reasoning = Finding("reasoning", "ok", "none", "turns are all answer")
    else:
        spec_r = REASONING.get(chat.reasoning.name)
        families = f" - {spec_r.families}" if spec_r else ""
        reasoning = Finding(
            "reasoning",
            "ok",
            f"{chat.reasoning.name}{families}",
            "thinking is split off (vLLM's reasoning parser) before the env "
            "and the tool parser see a turn; it stays in the token record "
            "and is trained",
        )
    return [tools, reasoning]


def rendered_call(tokenizer: Any, template_kwargs: Mapping[str, Any] | None = None) -> str:
    """The assistant turn of one ``add(a=2, b=3)`` call as the template renders it (as
    text: the tokens of a rendering need not split where the turns meet)."""
    tools = ToolSet([add]).schemas
    turn = [{"role": "assistant", "content": "", "tool_calls": [_CALL]}]
    kwargs = dict(template_kwargs or {})
    prompt = tokenizer.apply_chat_template(
        _PROMPT, tools=tools, add_generation_prompt=True, tokenize=False, **kwargs
    )
    full = tokenizer.apply_chat_template(_PROMPT + turn, tools=tools, tokenize=False, **kwargs)
    if full.startswith(prompt):
        rest = full[len(prompt) :]
    else:  # the template moves something when the assistant turn is added (Mistral)
        question = str(_PROMPT[-1]["content"])
        if question not in full:
            raise ValueError("the rendered call does not follow the generation prompt")
        rest = full[full.rindex(question) + len(question) :]
    ends = Conversation(tokenizer, list(_PROMPT), tools=tools).end_of_turn_ids
    for token in tokenizer.convert_ids_to_tokens(sorted(ends)):
        if token in rest:
            rest = rest[: rest.index(token)]
    return str(rest)


def _round_trip(tokenizer: Any, chat: ChatFormat) -> Finding:
    if chat.tools is None:
        return Finding("round trip", "note", "skipped (no tool format)", "nothing to read")
    try:
        text = rendered_call(tokenizer, chat.template_kwargs)
    except Exception as e:
        return Finding(
            "round trip",
            "warn",
            f"the template cannot render a call ({e})",
            "only the parser's side is used; check the format by hand",
        )
    parsed = chat.tools.parse(chat.answer(text), ToolSet([add]).schemas)
    got = [(c.name, dict(c.arguments)) for c in parsed.calls]
    if got == [("add", {"a": 2, "b": 3})] and not parsed.errors:
        return Finding(
            "round trip",
            "ok",
            f"{text.strip()!r} -> add(a=2, b=3)",
            "the template and the parser agree",
        )
    return Finding(
        "round trip",
        "error",
        f"{text.strip()!r} -> {got or parsed.errors}",
        f"the `{chat.tools.name}` parser cannot read this template's calls; "
        "set model.tool_format to the model's format",
    )


@dataclasses.dataclass(frozen=True, slots=True)
class HistoryCost:
    """What the template's handling of the history costs over a tool turn, an answer and
    a new user turn (the conversation :func:`check_model` simulates)."""

    segments: int
    """New segments the runner starts (each one a training sequence more)."""
    tokens: int
    """Tokens prefilled again for them (the prompts of those segments)."""
    breaks: tuple[str, ...]
    """Where the prefix breaks, and the first tokens that differ."""

    def __str__(self) -> str:
        if not self.segments:
            return "one sequence"
        return f"{self.segments} new segment(s), {self.tokens} tokens prefilled again"


_THINKING_OFF = "chat_template_kwargs = {enable_thinking = false}"
_THINKING_OFF_KEPT = f"{_THINKING_OFF} and keep_thinking"


def history_costs(tokenizer: Any, settings: ModelConfig) -> dict[str, HistoryCost]:
    """The cost under ``settings`` ("as set"), with ``model.keep_thinking``, and, for a
    template that reads ``enable_thinking`` the settings leave unset, with
    ``{enable_thinking = false}`` without and with keep_thinking.

    Raises:
        ConfigError: a setting names a parser vLLM does not have.
        Exception: whatever the template raises on the simulated conversation.
    """
    variants = {
        "as set": settings,
        "keep_thinking": dataclasses.replace(settings, keep_thinking=True),
    }
    template = getattr(tokenizer, "chat_template", None)
    kwargs = settings.chat_template_kwargs
    if (
        isinstance(template, str)
        and "enable_thinking" in template
        and "enable_thinking" not in kwargs
    ):
        off = dataclasses.replace(
            settings, chat_template_kwargs={**kwargs, "enable_thinking": False}
        )
        variants[_THINKING_OFF] = off
        variants[_THINKING_OFF_KEPT] = dataclasses.replace(off, keep_thinking=True)
    return {
        name: _simulate(tokenizer, resolve_chat_format(tokenizer, model))
        for name, model in variants.items()
    }


def _prefix(tokenizer: Any, settings: ModelConfig) -> list[Finding]:
    """Prefix preservation over a tool turn, an answer and a new user turn."""
    try:
        costs = history_costs(tokenizer, settings)
    except Exception as e:
        return [Finding("prefix", "warn", f"could not simulate a conversation ({e})", "-")]
    findings = [_prefix_finding(costs["as set"], costs["keep_thinking"])]
    if _THINKING_OFF in costs:
        off, both = costs[_THINKING_OFF], costs[_THINKING_OFF_KEPT]
        found = f"with model.{_THINKING_OFF}: {off}; with keep_thinking too: {both}"
        if off.segments and not both.segments:
            action = "the model answers without thinking; set model.keep_thinking = true with it"
        else:
            action = "the model answers without thinking"
        findings.append(Finding("thinking off", "note", found, action))
    return findings


def _prefix_finding(plain: HistoryCost, kept: HistoryCost) -> Finding:
    if not plain.breaks:
        return Finding(
            "prefix",
            "ok",
            "preserved over a tool turn and a new user turn",
            "one training sequence per episode",
        )
    where = "; ".join(plain.breaks)
    if kept.segments == 0:
        fix = "model.keep_thinking = true keeps one sequence (0 re-prefilled tokens)"
    else:
        fix = f"model.keep_thinking does not help here ({kept.segments} new segment(s) with it)"
    return Finding(
        "prefix",
        "warn",
        f"breaks at {where}",
        f"the runner starts a new segment there: {plain}; {fix}",
    )


def _simulate(tokenizer: Any, chat: ChatFormat) -> HistoryCost:
    tools = ToolSet([add]).schemas
    conv = Conversation(tokenizer, list(_PROMPT), tools=tools, template_kwargs=chat.template_kwargs)
    eot = tokenizer.eos_token_id
    eot = eot if eot in conv.end_of_turn_ids else min(conv.end_of_turn_ids)
    spec = REASONING.get(chat.reasoning.name) if chat.reasoning else None
    think = "<think>\nI should add.\n</think>\n\n" if _thinks(conv, spec) else ""
    call = rendered_call(tokenizer, chat.template_kwargs) if chat.tools else "Answer: 5"
    if spec is not None:  # without the template's own (empty) thinking
        call = call.split(spec.end)[-1]
    breaks: list[str] = []
    steps: list[tuple[str, str, list[Message] | None]] = [
        ("the tool result", think + call.lstrip("\n"), None),
        ("the new user turn", think + "Answer: 5", [{"role": "user", "content": "And 4 + 4?"}]),
    ]
    for where, text, new in steps:
        ids = [*tokenizer.encode(text, add_special_tokens=False), eot]
        conv.add_sampled(ids, [0.0] * len(ids), [0] * len(ids))
        conv.end_assistant_turn(conv.decode(ids), "stop")
        if new is None:
            parsed = chat.parse(
                ToolSet([add]), chat.answer(conv.messages[-1]["content"]), "stop", conv.turn - 1
            )
            new = chat.tool_results(conv, parsed, [ToolResult("add", "5")] * len(parsed.calls))
        before = conv.segments_started
        base = conv.render(conv.messages, add_generation_prompt=False)
        full = conv.render(conv.messages + new, add_generation_prompt=True)
        conv.add_messages(new, "env", keep_sampled=chat.keep_thinking)
        if conv.segments_started > before:
            breaks.append(f"{where} ({_difference(tokenizer, base, full)})")
    return HistoryCost(conv.segments_started, conv.reprefilled_tokens, tuple(breaks))


def _thinks(conv: Conversation, spec: ReasoningSpec | None) -> bool:
    """Whether the model writes thinking: the format has it, and the generation prompt
    does not close it already (Qwen3 with enable_thinking = false)."""
    if spec is None:
        return False
    prompt = conv.render(conv.messages, add_generation_prompt=True)
    history = conv.render(conv.messages, add_generation_prompt=False)
    opening = conv.tokenizer.decode(prompt[len(history) :], skip_special_tokens=False)
    return spec.end not in opening


def _difference(tokenizer: Any, base: list[int], full: list[int]) -> str:
    at = next(
        (i for i, (a, b) in enumerate(zip(base, full, strict=False)) if a != b),
        min(len(base), len(full)),
    )
    was = tokenizer.decode(base[at : at + 12], skip_special_tokens=False)
    now = tokenizer.decode(full[at : at + 12], skip_special_tokens=False)
    return f"token {at}: {was!r} becomes {now!r}"


def _special_tokens(tokenizer: Any, chat: ChatFormat) -> Finding:
    ends = Conversation(tokenizer, list(_PROMPT)).end_of_turn_ids
    names = sorted(tokenizer.convert_ids_to_tokens(sorted(ends)))
    markers = FORMATS[chat.tools.name].markers if chat.tools and chat.tools.name in FORMATS else ()
    split = [m for m in markers if len(tokenizer.encode(m, add_special_tokens=False)) != 1]
    found = f"turns end on {', '.join(names)}; {len(tokenizer.all_special_tokens)} special tokens"
    if split:
        return Finding(
            "special tokens",
            "note",
            f"{found}; call marker(s) {split} are not single tokens",
            "parsing works on text; fine",
        )
    return Finding("special tokens", "ok", found, "a turn ends at any of these tokens")


def _config_findings(tokenizer: Any, hf: dict[str, Any]) -> list[Finding]:
    window = hf.get("max_position_embeddings")
    tok_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_max, int) and tok_max < 10**9:
        window = min(window, tok_max) if window else tok_max
    context = Finding(
        "context",
        "ok" if window else "note",
        f"{window or 'unknown'} tokens",
        f"keep inference.max_model_len at most {window}"
        if window
        else "set inference.max_model_len to what the model was trained on",
    )
    tied = hf.get("tie_word_embeddings", True) if hf else None
    if tied is None:
        return [context, Finding("tied embeddings", "note", "unknown (no config.json)", "-")]
    if tied:
        action = (
            "on CPU vLLM's reload_weights keeps the old (tied) LM head: full-weight "
            "updates are only partly applied; agentrl warns at start; train with LoRA "
            "([trainer.lora] enabled = true) or untie the embeddings (GPU weight "
            "transfer is not affected)"
        )
        return [context, Finding("tied embeddings", "warn", "yes", action)]
    return [context, Finding("tied embeddings", "ok", "no", "weights publish in full, also on CPU")]


def load_hf_config(path: str) -> dict[str, Any]:
    """``config.json`` of a model folder (empty for a hub name that is not cached)."""
    file = Path(path) / "config.json"
    if file.is_file():
        return dict(json.loads(file.read_text()))
    try:
        from transformers import AutoConfig

        return dict(AutoConfig.from_pretrained(path).to_dict())
    except Exception:
        return {}


def check_tool_calls(model_path: str, settings: ModelConfig, env: EnvConfig) -> None:
    """The check ``agentrl train`` runs at start.

    Raises:
        ConfigError: the env declares tools and the model's tool calls cannot be parsed
            (no format in its template, or the parser cannot read the template's calls).
    """
    from transformers import AutoTokenizer

    from agentrl.env import make_env

    env_obj = make_env(env.id, **env.kwargs)
    try:
        has_tools = bool(getattr(env_obj.unwrapped, "tools", ()))
    finally:
        env_obj.close()
    if not has_tools:
        return
    report = check_model(
        AutoTokenizer.from_pretrained(model_path), name=model_path, settings=settings
    )
    bad = [
        f
        for f in report.findings
        if f.level == "error" or (f.topic == "tool format" and f.level == "warn")
    ]
    if bad:
        raise ConfigError(
            f"{env.id} gives the model tools, but {model_path}'s tool calls cannot be parsed: "
            f"{bad[0].found} ({bad[0].action}); run `agentrl check-model {model_path}`"
        )

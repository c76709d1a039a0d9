"""Real model families as test data: their chat templates and special tokens, with a tiny
local tokenizer (and, for the vLLM tests, a tiny model: :mod:`tests.models.family_model`)
built around each.

Each folder in ``fixtures/`` holds a family's real chat template (``chat_template.jinja``,
its source in ``family.json``) and the special tokens its tokenizer carries. No hub is
reachable here, so the tokenizer is a byte-level BPE trained in well under a second on
conversations rendered with that template; the special tokens are single tokens, as in
the real tokenizer, which is what the template, vLLM's parsers and agentrl look up.

Also the episode every family test runs (:class:`AddEnv`: one ``add`` tool, "What is
2 + 3?"), run by :func:`run_episode` with scripted output or by :func:`run_task` with any
client, and :func:`assert_token_record`, the check of its token record.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentrl.chat.formats import resolve_chat_format
from agentrl.config import ModelConfig, RolloutConfig
from agentrl.env import TextEnv, register_env
from agentrl.rollout import EpisodeRunner
from agentrl.tools import Tool
from agentrl.types import Task, Trajectory

FIXTURES = Path(__file__).parent / "fixtures"
NAMES = sorted(p.name for p in FIXTURES.iterdir() if (p / "family.json").is_file())


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    template: str
    special_tokens: list[str]
    bos: str | None
    eos: str
    pad: str
    tool_format: str
    reasoning: str | None
    model: str
    source: str


def family(name: str) -> Family:
    folder = FIXTURES / name
    data = json.loads((folder / "family.json").read_text())
    return Family(name=name, template=(folder / "chat_template.jinja").read_text(), **data)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


ADD_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "description": "The first number."},
                "b": {"type": "integer", "description": "The second number."},
            },
            "required": ["a", "b"],
        },
    },
}

# How each format writes `add(a=2, b=3)` and a broken call, as the model would sample it.
CALLS: dict[str, str] = {
    "hermes": '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
    "llama3_json": '{"name": "add", "parameters": {"a": 2, "b": 3}}',
    "mistral": '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 2, "b": 3}}]',
    "olmo3": "<function_calls>\nadd(a=2, b=3)\n</function_calls>",
}
MALFORMED: dict[str, str] = {
    "hermes": '<tool_call>\n{"name": "add", "arguments": {a: 2}}\n</tool_call>',
    "llama3_json": '{"name": "add", "parameters": {a: 2}}',
    "mistral": '[TOOL_CALLS] [{"name": "add", "arguments": {a: 2}}]',
    "olmo3": "<function_calls>\nadd(a=2, b=\n</function_calls>",
}
CUT: dict[str, str] = {
    "hermes": '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3' + " " * 200,
    "llama3_json": '{"name": "add", "parameters": {"a": 2, "b": 3' + " " * 200,
    "mistral": '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 2, "b": 3' + " " * 200,
    "olmo3": "<function_calls>\nadd(a=2, b=3" + " " * 200,
}
UNKNOWN: dict[str, str] = {
    k: v.replace('"add"', '"sub"').replace("add(", "sub(") for k, v in CALLS.items()
}
BAD_ARGUMENTS: dict[str, str] = {
    k: v.replace("3", '"three"').replace('b="three"', "b='three'") for k, v in CALLS.items()
}


def thinking(fam: Family, text: str) -> str:
    """``text`` as the family writes a turn: after its thinking, for thinking models."""
    return f"<think>\nI should add.\n</think>\n\n{text}" if fam.reasoning else text


def sample_conversation() -> list[dict[str, Any]]:
    """A tool conversation to train the tokenizer on (structured tool calls)."""
    call = {
        "id": "t0000c000",
        "type": "function",
        "function": {"name": "add", "arguments": {"a": 2, "b": 3}},
    }
    return [
        {"role": "system", "content": "Use the add tool, then answer with 'Answer: N'."},
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "add", "content": "5", "tool_call_id": "t0000c000"},
        {"role": "assistant", "content": "Answer: 5"},
        {"role": "user", "content": "And 4 + 4?"},
    ]


def build_tokenizer(fam: Family, *, vocab_size: int = 700) -> Any:
    """A byte-level BPE tokenizer with the family's special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=fam.special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(fam), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=fam.bos,
        eos_token=fam.eos,
        pad_token=fam.pad,
        additional_special_tokens=[
            t for t in fam.special_tokens if t not in (fam.bos, fam.eos, fam.pad)
        ],
        chat_template=fam.template,
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )


def _corpus(fam: Family) -> list[str]:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, indent=indent)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda f: "26 Jul 2024"
    template = env.from_string(fam.template)
    conv = sample_conversation()
    texts = [fam.template, *CALLS.values(), *MALFORMED.values()]
    for end in (2, 5, 6):
        texts.append(
            template.render(
                messages=conv[:end],
                tools=[ADD_SCHEMA],
                bos_token=fam.bos or "",
                eos_token=fam.eos,
                add_generation_prompt=True,
            )
        )
    return texts * 20


def _raise(message: str) -> None:
    raise ValueError(message)


class FamilyClient:
    """Scripted model output for a family: ``reply(prompt_ids)`` tokenized, then the
    family's end-of-turn token (an inference client for the runner)."""

    def __init__(
        self,
        tokenizer: Any,
        reply: Callable[[Sequence[int]], str],
        end_of_turn: str,
        max_model_len: int = 4096,
    ) -> None:
        self.tokenizer = tokenizer
        self.reply = reply
        self.version = 0
        self.max_model_len = max_model_len
        self.eot = tokenizer.convert_tokens_to_ids(end_of_turn)
        self.calls: list[tuple[list[int], Any]] = []

    async def generate(
        self, prompt_token_ids: Sequence[int], sampling: Any, request_id: str
    ) -> Any:
        from agentrl.inference.base import Generation

        ids = [
            *self.tokenizer.encode(self.reply(prompt_token_ids), add_special_tokens=False),
            self.eot,
        ]
        finish = "stop"
        if len(ids) > sampling.max_tokens:
            ids, finish = ids[: sampling.max_tokens], "length"
        gen = Generation(
            request_id,
            tuple(ids),
            tuple(-0.5 for _ in ids),
            finish,
            self.version,
            len(prompt_token_ids),
        )
        self.calls.append((list(prompt_token_ids), gen))
        return gen


class RecordingClient:
    """Passes every call to a real inference client and keeps what went in and came out
    (as :class:`FamilyClient` does for scripted output)."""

    def __init__(self, client: Any, tokenizer: Any, end_of_turn: str) -> None:
        self.client = client
        self.eot = tokenizer.convert_tokens_to_ids(end_of_turn)
        self.calls: list[tuple[list[int], Any]] = []

    @property
    def version(self) -> int:
        return int(self.client.version)

    @property
    def max_model_len(self) -> int:
        return int(self.client.max_model_len)

    async def generate(
        self, prompt_token_ids: Sequence[int], sampling: Any, request_id: str
    ) -> Any:
        gen = await self.client.generate(prompt_token_ids, sampling, request_id)
        self.calls.append((list(prompt_token_ids), gen))
        return gen


# How the template shows the result "5" of the call, per family.
RESULT_SHOWN = {
    "qwen2.5": "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>",
    "qwen3": "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>",
    "llama3.1": '<|start_header_id|>ipython<|end_header_id|>\n\n"5"<|eot_id|>',
    "llama3.2": '<|start_header_id|>ipython<|end_header_id|>\n\n"5"<|eot_id|>',
    "mistral-v0.3": '[TOOL_RESULTS] {"content": 5, "call_id": "t0000c000"}[/TOOL_RESULTS]',
    "olmo3": "<|im_start|>tool\nFunction add returned:\n5<|im_end|>",
}


class AddEnv(TextEnv):
    """Asks for 2 + 3 (then, with follow_up, for 4 + 4); rewards 'Answer: N'. The episode
    is the conversation `agentrl check-model` simulates (the same system prompt)."""

    tools = (add,)
    system_prompt = "Use the add tool, then answer with 'Answer: N'."

    def __init__(self, follow_up: bool = False) -> None:
        super().__init__()
        self.follow_up = follow_up

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.asked = 1
        return "What is 2 + 3?", {}

    def step(self, action: str):
        right = action.strip() in ("Answer: 5", "Answer: 8")
        if self.follow_up and self.asked == 1:
            self.asked = 2
            return "And 4 + 4?", float(right), False, False, {}
        return "", float(right), True, False, {}


register_env("tests/FamilyAdd-v0", AddEnv)


def script(*replies: str) -> Callable[[Sequence[int]], str]:
    queue = list(replies)

    def reply(prompt_ids: Sequence[int]) -> str:
        return queue.pop(0)

    return reply


async def run_task(
    client: Any,
    tokenizer: Any,
    *,
    max_tokens: int = 120,
    model: ModelConfig | None = None,
    temperature: float = 1.0,
    env_id: str = "tests/FamilyAdd-v0",
    **env_kwargs: Any,
) -> tuple[tuple[Trajectory, ...], EpisodeRunner]:
    """One episode of :class:`AddEnv` (or ``env_id``, an env like it) against ``client``,
    read as ``model`` says."""
    config = RolloutConfig(
        max_turns=6, max_tool_calls=4, max_tokens_per_turn=max_tokens, temperature=temperature
    )
    chat = resolve_chat_format(tokenizer, model)
    runner = EpisodeRunner(client, tokenizer, config, chat=chat)
    task = Task("t#0", env_id, 0, env_kwargs=env_kwargs)
    trajectories = await runner.run(task, "t#0/0")
    return tuple(trajectories), runner


async def run_episode(
    tokenizer: Any,
    fam: Family,
    replies: list[str],
    *,
    max_tokens: int = 120,
    model: ModelConfig | None = None,
    env_id: str = "tests/FamilyAdd-v0",
    **env_kwargs: Any,
) -> tuple[tuple[Trajectory, ...], FamilyClient, EpisodeRunner]:
    """One episode of :class:`AddEnv` (or ``env_id``) with ``replies`` as the model's turns."""
    client = FamilyClient(tokenizer, script(*replies), fam.eos)
    trajectories, runner = await run_task(
        client, tokenizer, max_tokens=max_tokens, model=model, env_id=env_id, **env_kwargs
    )
    return trajectories, client, runner


def render(
    tokenizer: Any, messages: list[dict[str, Any]], gen: bool, **template_kwargs: Any
) -> list[int]:
    """The template's tokens for ``messages`` with :class:`AddEnv`'s tool."""
    tools = [Tool(add).schema]
    out = tokenizer.apply_chat_template(
        messages,
        tools=tools,
        add_generation_prompt=gen,
        tokenize=True,
        return_dict=True,
        **template_kwargs,
    )
    return list(out["input_ids"])


def assert_token_record(
    traj: Trajectory, client: Any, tokenizer: Any, **template_kwargs: Any
) -> None:
    """token_ids = the sampled tokens, exactly, plus the template's own renderings
    (``client``: a :class:`FamilyClient` or :class:`RecordingClient`)."""
    ids = list(traj.token_ids)
    spans = list(traj.spans)
    assert spans[0].start == 0 and spans[-1].end == len(ids)
    assert all(a.end == b.start for a, b in itertools.pairwise(spans))
    sampled = [list(g.token_ids) for _, g in client.calls]
    assert [ids[s.start : s.end] for s in spans if s.kind == "assistant"] == sampled
    messages = traj.messages
    at = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    kwargs = template_kwargs
    assert ids[: spans[0].end] == render(tokenizer, messages[: at[0]], True, **kwargs)
    eot = client.eot
    for turn, j in enumerate(at[:-1]):
        base = render(tokenizer, messages[: j + 1], False, **kwargs)
        full = render(tokenizer, messages[: at[turn + 1]], True, **kwargs)
        assert full[: len(base)] == base  # one segment: the template kept the prefix
        last_eot = max(i for i, t in enumerate(base) if t == eot)
        expected = base[last_eot + 1 :] + full[len(base) :]
        between = [s for s in spans if s.kind != "assistant" and s.turn == turn + 1]
        assert [t for s in between for t in ids[s.start : s.end]] == expected

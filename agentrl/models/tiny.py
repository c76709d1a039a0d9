"""A tiny Qwen2-family model and byte-level BPE tokenizer, built locally in seconds.

These machines cannot reach a model hub, so tests and the demo build their own model:
a small ``Qwen2ForCausalLM`` with random weights and a byte-level BPE tokenizer trained
on text generated here (chat turns, tool schemas, Hermes-style tool calls, arithmetic).
The tokenizer carries a Qwen-style chat template that renders tool schemas and
``<tool_call>{json}</tool_call>`` calls, so the same code paths serve the tiny model
and a real Qwen model.

The build is deterministic: the same :class:`TinyModelConfig` gives byte-identical
files. It is cached in a folder keyed by a hash of the config (and of this builder's
revision), written to a temporary folder first and renamed into place, so concurrent
builders never see a half-written model.

In: a :class:`TinyModelConfig`. Out: the path of a folder that transformers'
``from_pretrained`` and vLLM both load.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

# Bump when the builder's output changes for the same config (invalidates caches).
BUILDER_REVISION = 2

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)

# Qwen2.5 / Hermes-style template, kept compact because the tiny model's context is short.
# Tool results from consecutive `tool` messages share one user turn, as in Qwen2.5.
# Every line opens with `{%-` or `{{-` and every newline is a string literal, so the
# output does not depend on the Jinja environment's trim_blocks/lstrip_blocks.
CHAT_TEMPLATE = r"""
{%- if messages and messages[0].role == 'system' %}{% set system = messages[0].content %}{% set rest = messages[1:] %}{% else %}{% set system = 'You are a helpful assistant.' %}{% set rest = messages %}{% endif %}
{{- '<|im_start|>system\n' ~ system }}
{%- if tools %}
    {{- '\n# Tools\n<tools>' }}
    {%- for tool in tools %}{{ '\n' ~ ((tool.function if tool.function is defined else tool) | tojson) }}{% endfor %}
    {{- '\n</tools>\nCall a tool with <tool_call>{"name": NAME, "arguments": ARGS}</tool_call>' }}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- for m in rest %}
    {%- if m.role == 'tool' %}
        {%- if loop.first or rest[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}{% endif %}
        {{- '\n<tool_response>\n' ~ m.content ~ '\n</tool_response>' }}
        {%- if loop.last or rest[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\n' }}{% endif %}
    {%- else %}
        {{- '<|im_start|>' ~ m.role ~ '\n' }}
        {%- if m.content %}{{ m.content }}{% endif %}
        {%- if m.role == 'assistant' and m.tool_calls %}
            {%- for tc in m.tool_calls %}
                {%- set f = tc.function if tc.function is defined else tc %}
                {%- if not loop.first or m.content %}{{ '\n' }}{% endif %}
                {{- '<tool_call>\n{"name": "' ~ f.name ~ '", "arguments": ' }}
                {%- if f.arguments is string %}{{ f.arguments }}{% else %}{{ f.arguments | tojson }}{% endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}
""".strip()


@dataclasses.dataclass(frozen=True, slots=True)
class TinyModelConfig:
    """Shape of the tiny model and its tokenizer.

    The defaults give a ~0.4M-parameter model that vLLM starts in seconds on a CPU.
    """

    vocab_size: int = 512
    """Target vocabulary size of the BPE tokenizer (bytes + merges + special tokens)."""
    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    """Heads of 64: vLLM's CPU attention kernels support head sizes like 64, not 16."""
    num_key_value_heads: int = 1
    intermediate_size: int = 256
    max_position_embeddings: int = 2048
    initializer_range: float = 0.1
    """Wider than Qwen's 0.02 so greedy decoding has clear margins between tokens."""
    seed: int = 0
    corpus_examples: int = 3000
    """Number of generated text samples the tokenizer is trained on."""
    architecture: str = "qwen2"
    """``qwen2`` or ``qwen3`` (per-head q/k norms, no qkv bias). transformers loads every
    ``qwen2`` model with Qwen's own pre-tokenizer (one digit per token), so a tokenizer
    with ``number_chunks`` needs ``qwen3``, whose tokenizer is read from its files."""
    number_chunks: bool = False
    aligned_head: bool = False
    """Start the (untied) LM head as a copy of the input embeddings, so that copying a
    token from the context (an operand into a tool call, a tool result into an answer)
    is natural from the first step instead of learned token by token."""
    """Split numbers into chunks of up to three digits, each chunk one token (as Llama 3
    and GPT-4 tokenizers do), instead of one token per digit (as Qwen). Copying a number
    then means copying one or two tokens, which a tiny model learns far sooner."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.architecture not in ("qwen2", "qwen3"):
            raise ValueError(f"architecture must be 'qwen2' or 'qwen3', not {self.architecture!r}")
        if self.number_chunks and self.architecture == "qwen2":
            raise ValueError(
                "number_chunks needs architecture='qwen3': transformers replaces the "
                "pre-tokenizer of every qwen2 model with Qwen's one-digit-per-token one"
            )
        if self.vocab_size < 256 + len(SPECIAL_TOKENS):
            raise ValueError(
                f"vocab_size ({self.vocab_size}) must be at least "
                f"{256 + len(SPECIAL_TOKENS)}: 256 byte tokens plus the special tokens"
            )

    def key(self) -> str:
        """A short hash that names this config's cache folder."""
        fields = dataclasses.asdict(self)
        defaults = (("number_chunks", False), ("architecture", "qwen2"), ("aligned_head", False))
        for name, default in defaults:
            if fields[name] == default:  # keeps the cache keys of configs made before
                del fields[name]
        payload = json.dumps({"revision": BUILDER_REVISION, **fields}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


def default_cache_dir() -> Path:
    """Where built models are cached: ``$AGENTRL_CACHE`` or ``~/.cache/agentrl``."""
    root = os.environ.get("AGENTRL_CACHE") or Path.home() / ".cache" / "agentrl"
    return Path(root) / "models"


def build_tiny_model(
    config: TinyModelConfig | None = None, *, cache_dir: str | Path | None = None
) -> Path:
    """Build (or reuse from the cache) the tiny model and return its folder.

    Args:
        config: model and tokenizer shape; defaults to :class:`TinyModelConfig()`.
        cache_dir: parent folder of the cached models; defaults to
            :func:`default_cache_dir`.

    Returns:
        A folder holding ``config.json``, ``model.safetensors``, the tokenizer files
        and ``generation_config.json``.
    """
    config = config or TinyModelConfig()
    parent = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = parent / f"tiny-{config.architecture}-{config.key()}"
    if _complete(target):
        return target
    parent.mkdir(parents=True, exist_ok=True)
    # One builder at a time (several processes of one launch start together); the
    # others wait and then find the finished folder.
    with open(parent / ".build.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _complete(target):
            return target
        staging = Path(tempfile.mkdtemp(prefix=".building-", dir=parent))
        try:
            _write_model(config, staging)
            if target.exists():  # a folder left by a builder that was killed
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    logger.info("built tiny model in %s", target)
    return target


def _complete(folder: Path) -> bool:
    return all(
        (folder / f).is_file() for f in ("agentrl-tiny.json", "config.json", "model.safetensors")
    )


def _write_model(config: TinyModelConfig, out: Path) -> None:
    import torch
    from transformers import (
        GenerationConfig,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    tokenizer = build_tokenizer(config)
    tokenizer.save_pretrained(out)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config_class, model_class = (
        (Qwen3Config, Qwen3ForCausalLM)
        if config.architecture == "qwen3"
        else (Qwen2Config, Qwen2ForCausalLM)
    )
    extra = {"head_dim": config.hidden_size // config.num_attention_heads}
    model_config = config_class(
        **(extra if config.architecture == "qwen3" else {}),
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        intermediate_size=config.intermediate_size,
        max_position_embeddings=config.max_position_embeddings,
        initializer_range=config.initializer_range,
        # Untied on purpose: vLLM's in-place `reload_weights` on CPU does not refresh a
        # tied LM head (it keeps the old packed copy), so new weights would be half-applied.
        tie_word_embeddings=False,
        bos_token_id=eot,
        eos_token_id=im_end,
        pad_token_id=eot,
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(config.seed)
    try:
        model = model_class(model_config).to(torch.float32)
        if config.aligned_head:
            with torch.no_grad():
                model.lm_head.weight.copy_(model.model.embed_tokens.weight)
    finally:
        torch.random.set_rng_state(generator_state)
    model.generation_config = GenerationConfig(
        bos_token_id=eot, eos_token_id=[im_end, eot], pad_token_id=eot
    )
    with _no_progress_bar():  # a bar for the one shard of a tiny model says nothing
        model.save_pretrained(out)
    marker = {"builder_revision": BUILDER_REVISION, "config": dataclasses.asdict(config)}
    (out / "agentrl-tiny.json").write_text(json.dumps(marker, indent=2, sort_keys=True))


@contextlib.contextmanager
def _no_progress_bar() -> Iterator[None]:
    """transformers' progress bars off for the block (as they were after it)."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def build_tokenizer(config: TinyModelConfig):  # -> transformers.PreTrainedTokenizerFast
    """Train the byte-level BPE tokenizer on generated text and wrap it for transformers.

    Digits are split one per token (as in Qwen), or with ``number_chunks`` into
    left-aligned chunks of up to three digits (``1786`` is ``178`` ``6``), every chunk
    from ``0`` to ``999`` (leading zeros included) being one token.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    digits = (
        pre_tokenizers.Split(Regex(r"\d{1,3}"), behavior="isolated")
        if config.number_chunks
        else pre_tokenizers.Digits(individual_digits=True)
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [digits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(config), trainer=trainer)
    if config.number_chunks:
        split = [c for c in _number_chunks() if len(tok.encode(c).ids) != 1]
        if split:
            raise ValueError(
                f"vocab_size {config.vocab_size} is too small for number_chunks: "
                f"{len(split)} chunks (e.g. {split[0]!r}) are not single tokens; raise it "
                f"to at least {256 + len(SPECIAL_TOKENS) + 1110 + 400}"
            )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=list(SPECIAL_TOKENS[1:2] + SPECIAL_TOKENS[3:]),
        chat_template=CHAT_TEMPLATE,
        model_max_length=config.max_position_embeddings,
        clean_up_tokenization_spaces=False,
    )


_WORDS = (
    "what is the answer use tool calculator compute result please value number sum "
    "product difference total find move left right up down step state done you are a "
    "helpful assistant agent question expression arguments name function call"
).split()


def _number_chunks() -> list[str]:
    """Every string of one to three digits: the number tokens of ``number_chunks``."""
    return [f"{n:0{width}d}" for width in (1, 2, 3) for n in range(10**width)]


def _corpus(config: TinyModelConfig):
    """Deterministic text in the shapes the tiny model will see."""
    rng = random.Random(config.seed)
    if config.number_chunks:
        # Frequent enough that BPE merges every chunk before rarer text pairs.
        chunks = " ".join(_number_chunks())
        for _ in range(64):
            yield chunks
    schema = {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    }
    system = "You are a helpful assistant."
    if config.number_chunks:
        # The newer tokenizers also learn the calculator env's exact prompt (its tool
        # schema as agentrl renders it), which then takes a few dozen tokens, not 150.
        system = "Use the calculator tool, then reply with 'Answer: N'."
        schema = {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {
                    "expression": {
                        "type": "string",
                        "description": "Numbers and the operators + - * / // % ** with "
                        'parentheses, e.g. "47*38".',
                    }
                },
                "required": ["expression"],
            },
            "return": {"type": "string"},
        }
    for _ in range(config.corpus_examples):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op = rng.choice("+-*")
        value = eval(f"{a}{op}{b}")
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12)))
        call = json.dumps({"name": "calculator", "arguments": {"expression": f"{a}{op}{b}"}})
        yield (
            f"<|im_start|>system\n{system}\n# Tools\n<tools>\n"
            f"{json.dumps(schema)}\n</tools>\nCall a tool with <tool_call>"
            f'{{"name": NAME, "arguments": ARGS}}</tool_call><|im_end|>\n'
            f"<|im_start|>user\nWhat is {a} {op} {b}? {words}<|im_end|>\n"
            f"<|im_start|>assistant\n<tool_call>\n{call}\n</tool_call><|im_end|>\n"
            f"<|im_start|>user\n<tool_response>\n{value}\n</tool_response><|im_end|>\n"
            f"<|im_start|>assistant\nAnswer: {value}<|im_end|>\n"
        )

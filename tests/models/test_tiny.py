"""The locally built tiny model: deterministic, cached, loadable, with a tool-aware template."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from agentrl.errors import ModelNotFoundError
from agentrl.models import resolve_model
from agentrl.models.tiny import TinyModelConfig, build_tiny_model

SMALL = TinyModelConfig(vocab_size=320, hidden_size=64, num_attention_heads=1, corpus_examples=300)


def _digest(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if p.is_file()
    }


def test_build_is_deterministic_and_cached(tmp_path: Path) -> None:
    first = build_tiny_model(SMALL, cache_dir=tmp_path / "a")
    second = build_tiny_model(SMALL, cache_dir=tmp_path / "b")
    assert _digest(first) == _digest(second)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(_digest(first))
    mtime = (first / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(SMALL, cache_dir=tmp_path / "a") == first
    assert (first / "model.safetensors").stat().st_mtime_ns == mtime, "cache hit rebuilt"
    other = build_tiny_model(dataclasses.replace(SMALL, seed=1), cache_dir=tmp_path / "a")
    assert other != first
    assert _digest(other)["model.safetensors"] != _digest(first)["model.safetensors"]
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.startswith(".building")]


def test_loads_in_transformers_with_tool_template(tiny_model: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    assert model.config.model_type == "qwen2"
    assert model.config.vocab_size == len(tokenizer)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "calculator",
                "description": "Evaluate an arithmetic expression.",
                "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
            },
        }
    ]
    call = {
        "type": "function",
        "function": {"name": "calculator", "arguments": {"expression": "12*7"}},
    }
    messages = [
        {"role": "user", "content": "What is 12 * 7?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "84"},
        {"role": "assistant", "content": "Answer: 84"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    assert '<tools>\n{"name": "calculator"' in text
    assert (
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call>'
        in text
    )
    assert "<|im_start|>user\n<tool_response>\n84\n</tool_response><|im_end|>" in text
    prompt = tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    # Special tokens are single tokens; digits are one token each.
    for special in ("<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>"):
        assert len(tokenizer.encode(special)) == 1, special
    assert [t for t in tokenizer.tokenize("1234") if t.strip("Ġ")] == ["1", "2", "3", "4"]
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert model.generation_config.eos_token_id[0] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(tokenizer))
    marker = json.loads((tiny_model / "agentrl-tiny.json").read_text())
    assert marker["config"]["hidden_size"] == TinyModelConfig().hidden_size


def test_invalid_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="hidden_size"):
        TinyModelConfig(hidden_size=100, num_attention_heads=3)
    with pytest.raises(ValueError, match="vocab_size"):
        TinyModelConfig(vocab_size=100)


def test_resolve_model(tiny_model: Path, tmp_path: Path) -> None:
    assert resolve_model(str(tiny_model)) == str(tiny_model.resolve())
    assert resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model(str(tmp_path / "missing"))
    with pytest.raises(ModelNotFoundError, match=r"no config\.json"):
        resolve_model(str(tmp_path))

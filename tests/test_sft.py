"""SFT warm start: demonstrations tokenized as RL sees them, trained with TRL's SFTTrainer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrl.chat import Conversation
from agentrl.sft import SFTSettings, demonstration_example, warm_start
from agentrl.tools import ToolSet
from examples.calculator_agent.demonstrations import demonstrations, estimate
from tools.calculator import calculator


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def test_demonstration_tokens_match_the_rollout_conversation(tokenizer) -> None:
    schemas = ToolSet([calculator]).schemas
    (demo,) = demonstrations(1, 1.0)
    example = demonstration_example(tokenizer, demo, schemas)
    ids, mask = example["input_ids"], example["assistant_masks"]
    # The runner's conversation: prompt rendered, sampled ids appended, tool turn as a delta.
    conv = Conversation(tokenizer, demo[:2], tools=schemas)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    expected_mask = [0] * len(conv)
    for message in demo[2:]:
        if message["role"] == "assistant":
            sampled = [*tokenizer.encode(message["content"], add_special_tokens=False), im_end]
            conv.add_sampled(sampled, [0.0] * len(sampled), [0] * len(sampled))
            conv.end_assistant_turn(message["content"], "stop")
            expected_mask += [1] * len(sampled)
        else:
            before = len(conv)
            assert conv.add_messages([message], "tool")
            expected_mask += [0] * (len(conv) - before)
    assert ids == conv.token_ids and mask == expected_mask
    # exactly the two assistant turns (each with its end-of-turn token) are trained
    trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    call, answer = demo[2]["content"], demo[4]["content"]
    assert trained == f"{call}<|im_end|>{answer}<|im_end|>"


def test_guess_demonstrations_and_estimates() -> None:
    assert (estimate(1786), estimate(-47), estimate(7), estimate(950)) == (2000, -50, 7, 1000)
    demos = demonstrations(200, 0.3)
    with_tool = sum(any(m["role"] == "tool" for m in d) for d in demos)
    assert 40 <= with_tool <= 80
    assert len({d[1]["content"] for d in demos}) > 190  # distinct problems


def test_warm_start_lowers_the_assistant_loss(tokenizer, tiny_model: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    schemas = ToolSet([calculator]).schemas
    rows = [demonstration_example(tokenizer, d, schemas) for d in demonstrations(64, 1.0)]

    def loss(path: Path) -> float:
        model = AutoModelForCausalLM.from_pretrained(path)
        total, count = 0.0, 0
        with torch.no_grad():
            for row in rows[:16]:
                ids = torch.tensor([row["input_ids"]])
                pairs = zip(row["input_ids"], row["assistant_masks"], strict=True)
                labels = torch.tensor([[t if m else -100 for t, m in pairs]])
                out = model(input_ids=ids, labels=labels)
                n = int(sum(row["assistant_masks"])) - 1
                total, count = total + float(out.loss) * n, count + n
        return total / count

    out = tmp_path / "warm"
    lines: list[str] = []
    result = warm_start(
        tiny_model, [(SFTSettings(steps=12, batch_size=8, lr=3e-3), rows)], out, on_log=lines.append
    )
    assert result == out and (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    assert not (tmp_path / ".warm.partial").exists()
    assert any("sft stage 1: step 12/12" in line for line in lines)
    assert loss(out) < 0.7 * loss(tiny_model)
    with pytest.raises(Exception, match="already holds a model"):
        warm_start(tiny_model, [(SFTSettings(steps=1), rows)], out)

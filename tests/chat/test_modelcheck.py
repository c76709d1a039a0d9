"""``agentrl check-model`` on every family fixture, and the check ``agentrl train`` runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.chat.modelcheck import check_model, check_tool_calls
from agentrl.config import EnvConfig, ModelConfig
from agentrl.env import TextEnv, register_env
from agentrl.errors import ConfigError
from tests.models.families import NAMES, add, build_tokenizer, family

pytestmark = pytest.mark.timeout(300)

# Where each real template breaks the prefix (a new segment), over a tool turn and a new
# user turn: Qwen3 drops past thinking, Mistral v0.3 moves [AVAILABLE_TOOLS] to the last
# user message.
BREAKS = {"qwen3", "mistral-v0.3"}


@pytest.mark.parametrize("name", NAMES)
def test_report_of_each_family(name: str) -> None:
    hf_config = {"max_position_embeddings": 2048, "tie_word_embeddings": True}
    report = check_model(build_tokenizer(family(name)), name=name, hf_config=hf_config)
    by_topic = {f.topic: f for f in report.findings}
    assert report.ok, report
    assert by_topic["tool format"].found.startswith(family(name).tool_format)
    assert by_topic["round trip"].level == "ok", by_topic["round trip"]
    assert by_topic["round trip"].found.endswith("-> add(a=2, b=3)")
    prefix = by_topic["prefix"]
    assert prefix.level == ("warn" if name in BREAKS else "ok"), prefix
    if name in BREAKS:  # and keep_thinking would keep one sequence
        assert "0 re-prefilled tokens" in prefix.action
    assert by_topic["tied embeddings"].level == "warn"
    assert by_topic["context"].found == "2048 tokens"


def test_a_wrong_format_fails_the_round_trip() -> None:
    tokenizer = build_tokenizer(family("llama3.2"))
    report = check_model(tokenizer, settings=ModelConfig(tool_format="hermes"))
    assert not report.ok
    assert [f.topic for f in report.findings if f.level == "error"] == ["round trip"]


class ToolEnv(TextEnv):
    tools = (add,)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "What is 2 + 3?", {}

    def step(self, action: str):
        return "", 0.0, True, False, {}


register_env("tests/CheckModelTools-v0", ToolEnv)


def test_train_stops_when_an_env_with_tools_meets_unparseable_calls(tmp_path: Path) -> None:
    env = EnvConfig(id="tests/CheckModelTools-v0")
    good = build_tokenizer(family("olmo3"))
    good.save_pretrained(tmp_path / "good")
    check_tool_calls(str(tmp_path / "good"), ModelConfig(), env)  # passes
    plain = build_tokenizer(family("olmo3"))
    plain.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    plain.save_pretrained(tmp_path / "plain")
    with pytest.raises(ConfigError, match=r"tool calls cannot be parsed.*check-model"):
        check_tool_calls(str(tmp_path / "plain"), ModelConfig(), env)
    with pytest.raises(ConfigError, match=r"model\.tool_format = 'nope'"):
        check_tool_calls(str(tmp_path / "good"), ModelConfig(tool_format="nope"), env)
    with pytest.raises(ConfigError, match=r"model\.reasoning"):
        ModelConfig(reasoning="no such thing")

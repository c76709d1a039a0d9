"""Qwen3's thinking and its template's history: what each setting costs, and that
``model.chat_template_kwargs`` reaches every rendering and the reasoning parser.

One episode with Qwen3's real template and scripted output: a tool call, an answer, a new
user turn, a second answer. A new segment re-prefills the whole conversation: the prompt
of every segment after the first. The template decides where that happens:

==========================================  =========  =================================
setting                                     segments   where the prefix breaks
==========================================  =========  =================================
default (the model thinks)                  2          the new user turn: past thinking
                                                       is dropped
keep_thinking = true                        1          -
chat_template_kwargs = {enable_thinking     3          the tool result and the new user
= false} (no thinking)                                 turn: the empty ``<think>`` block
                                                       is written only after the
                                                       generation prompt and for the
                                                       last turn, so it vanishes once
                                                       any message follows
both                                        1          -
==========================================  =========  =================================

Measured with the fixture tokenizer: 271, 0, 536 and 0 tokens prefilled again, the same
as ``agentrl check-model`` reports (it simulates this conversation).
"""

from __future__ import annotations

import pytest

from agentrl.chat.formats import resolve_chat_format
from agentrl.chat.modelcheck import check_model, history_costs
from agentrl.config import ModelConfig, RolloutConfig
from agentrl.errors import InfraError
from agentrl.rollout import EpisodeRunner
from agentrl.types import PartialEpisode, Task
from tests.models.families import (
    CALLS,
    FamilyClient,
    build_tokenizer,
    family,
    render,
    run_episode,
    script,
    thinking,
)

pytestmark = pytest.mark.timeout(120)

NO_THINKING = {"enable_thinking": False}
# setting: (model config, whether the model thinks, segments)
SETTINGS = {
    "default": (ModelConfig(), True, 2),
    "keep_thinking": (ModelConfig(keep_thinking=True), True, 1),
    "enable_thinking=false": (ModelConfig(chat_template_kwargs=NO_THINKING), False, 3),
    "both": (ModelConfig(keep_thinking=True, chat_template_kwargs=NO_THINKING), False, 1),
}


@pytest.fixture(scope="module")
def qwen3():
    f = family("qwen3")
    return f, build_tokenizer(f)


@pytest.mark.parametrize("setting", list(SETTINGS))
async def test_segments_and_reprefilled_tokens_per_setting(qwen3, setting: str) -> None:
    f, tokenizer = qwen3
    model, thinks, segments = SETTINGS[setting]
    turn = (lambda text: thinking(f, text)) if thinks else (lambda text: text)
    replies = [turn(CALLS["hermes"]), turn("Answer: 5"), turn("Answer: 8")]
    trajs, client, runner = await run_episode(tokenizer, f, replies, model=model, follow_up=True)
    assert trajs[-1].reward == 2.0 and trajs[-1].status == "finished"
    assert [e["action"] for e in trajs[-1].env_log if "action" in e] == ["Answer: 5", "Answer: 8"]
    sampled = [list(g.token_ids) for _, g in client.calls]
    got = [
        t.token_ids[s.start : s.end].tolist()
        for t in trajs
        for s in t.spans
        if s.kind == "assistant"
    ]
    assert got == sampled  # every sampled token is in the record, thinking included
    counters = runner.metrics.counters
    assert len(trajs) == segments and counters["template_new_segments"] == segments - 1
    prompts = [s.end - s.start for t in trajs[1:] for s in t.spans if s.kind == "prompt"]
    assert counters["template_reprefilled_tokens"] == sum(prompts)
    if model.keep_thinking and thinks:  # the history keeps the thinking as sampled
        assert "I should add." in tokenizer.decode(trajs[0].token_ids[: trajs[0].spans[-1].start])
    kwargs = model.chat_template_kwargs
    simulated = history_costs(tokenizer, model)["as set"]  # what check-model reports
    assert (simulated.segments, simulated.tokens) == (segments - 1, sum(prompts))
    messages = trajs[-1].messages
    at = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    for t in trajs[1:]:  # a new segment starts from the template's rendering of all so far
        turn = next(s.turn for s in t.spans if s.kind == "assistant")
        start = t.token_ids[: t.spans[0].end].tolist()
        assert start == render(tokenizer, messages[: at[turn]], True, **kwargs)


def test_the_kwargs_reach_the_renderings_and_the_reasoning_parser(qwen3) -> None:
    """With enable_thinking = false every generation prompt closes an empty thinking block,
    and a turn without ``</think>`` is all answer (by default it is all thinking)."""
    _, tokenizer = qwen3
    default = resolve_chat_format(tokenizer)
    off = resolve_chat_format(tokenizer, ModelConfig(chat_template_kwargs=NO_THINKING))
    assert off.template_kwargs == NO_THINKING and default.template_kwargs == {}
    assert default.answer("Answer: 5") == "" and off.answer("Answer: 5") == "Answer: 5"
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    plain = tokenizer.decode(render(tokenizer, messages, True))
    closed = tokenizer.decode(render(tokenizer, messages, True, **NO_THINKING))
    assert plain.endswith("<|im_start|>assistant\n")
    assert closed == plain + "<think>\n\n</think>\n\n"


async def test_every_prompt_of_an_episode_is_rendered_with_the_kwargs(qwen3) -> None:
    f, tokenizer = qwen3
    model = ModelConfig(keep_thinking=True, chat_template_kwargs=NO_THINKING)
    replies = [CALLS["hermes"], "Answer: 5", "Answer: 8"]
    (traj,), client, _ = await run_episode(tokenizer, f, replies, model=model, follow_up=True)
    assert traj.env_log[1]["result"] == "5" and traj.reward == 2.0
    assert len(client.calls) == 3
    for prompt, _ in client.calls:  # what the model was asked to continue, each turn
        assert tokenizer.decode(prompt).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


async def test_a_resumed_episode_renders_with_the_kwargs(qwen3) -> None:
    """The turns after a checkpoint are rendered with the kwargs too."""
    f, tokenizer = qwen3
    model = ModelConfig(keep_thinking=True, chat_template_kwargs=NO_THINKING)
    chat = resolve_chat_format(tokenizer, model)
    config = RolloutConfig(max_turns=6, max_tool_calls=4, max_tokens_per_turn=120)
    partials: list[PartialEpisode] = []
    first = FamilyClient(tokenizer, script(CALLS["hermes"]), f.eos)
    runner = EpisodeRunner(first, tokenizer, config, chat=chat, checkpoint=partials.append)
    task = Task("t#0", "tests/FamilyAdd-v0", 0, env_kwargs={"follow_up": True})
    with pytest.raises(InfraError):  # the "engine" fails after the tool call: a crash
        await runner.run(task, "t#0/0")
    rest = FamilyClient(tokenizer, script("Answer: 5", "Answer: 8"), f.eos)
    (traj,) = await EpisodeRunner(rest, tokenizer, config, chat=chat).resume(partials[-1])
    assert traj.reward == 2.0 and len(rest.calls) == 2
    for prompt, _ in rest.calls:
        assert tokenizer.decode(prompt).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_check_model_reports_what_thinking_off_costs(qwen3) -> None:
    _, tokenizer = qwen3
    by_topic = {f.topic: f for f in check_model(tokenizer).findings}
    assert by_topic["prefix"].level == "warn"
    off = by_topic["thinking off"]
    assert off.found.startswith("with model.chat_template_kwargs = {enable_thinking = false}: 2 ")
    assert off.found.endswith("with keep_thinking too: one sequence")
    settings = ModelConfig(chat_template_kwargs=NO_THINKING)  # set: measured as set
    by_topic = {f.topic: f for f in check_model(tokenizer, settings=settings).findings}
    assert "thinking off" not in by_topic
    assert by_topic["prefix"].found.startswith("breaks at the tool result")

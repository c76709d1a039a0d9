"""Real model families through the runner: each family's real chat template, vLLM's parser
for its tool-call format, scripted model output in that format.

For every family: the format and reasoning are detected from the template; a tool call
written the family's way runs the tool, its result comes back the way the template shows
it, and the token record is exactly the sampled tokens plus the template's renderings;
each kind of broken call (malformed, cut off, unknown tool, bad arguments) is shown to
the model and counted under its kind.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import pytest

from agentrl.chat.formats import resolve_chat_format
from agentrl.config import ModelConfig, RolloutConfig
from agentrl.env import TextEnv, register_env
from agentrl.rollout import EpisodeRunner
from agentrl.types import Task, Trajectory
from tests.models.families import (
    BAD_ARGUMENTS,
    CALLS,
    CUT,
    MALFORMED,
    NAMES,
    UNKNOWN,
    FamilyClient,
    add,
    build_tokenizer,
    family,
    thinking,
)

pytestmark = pytest.mark.timeout(300)

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
    """Asks for 2 + 3 (then, with follow_up, for 4 + 4); rewards 'Answer: N'."""

    tools = (add,)

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


@pytest.fixture(scope="module", params=NAMES)
def fam(request: pytest.FixtureRequest) -> Any:
    f = family(request.param)
    return f, build_tokenizer(f)


def script(*replies: str):
    queue = list(replies)

    def reply(prompt_ids: Sequence[int]) -> str:
        return queue.pop(0)

    return reply


async def run_episode(
    tokenizer: Any, fam: Any, replies: list[str], *, max_tokens: int = 120,
    model: ModelConfig | None = None, **env_kwargs: Any,
) -> tuple[tuple[Trajectory, ...], FamilyClient, EpisodeRunner]:  # fmt: skip
    client = FamilyClient(tokenizer, script(*replies), fam.eos)
    config = RolloutConfig(max_turns=6, max_tool_calls=4, max_tokens_per_turn=max_tokens)
    chat = resolve_chat_format(tokenizer, model)
    runner = EpisodeRunner(client, tokenizer, config, chat=chat)
    task = Task("t#0", "tests/FamilyAdd-v0", 0, env_kwargs=env_kwargs)
    trajectories = await runner.run(task, "t#0/0")
    return tuple(trajectories), client, runner


def test_format_and_reasoning_are_detected_from_the_template(fam) -> None:
    f, tokenizer = fam
    chat = resolve_chat_format(tokenizer)
    assert chat.tools is not None and chat.tools.name == f.tool_format
    assert (chat.reasoning.name if chat.reasoning else None) == f.reasoning
    for token in f.special_tokens:  # one token each, as in the real tokenizer
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token


def render(tokenizer: Any, messages: list[dict[str, Any]], gen: bool) -> list[int]:
    tools = [{"type": "function", "function": {k: v for k, v in s.items()}}
             for s in [_add_schema()]]  # fmt: skip
    out = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=gen,
                                        tokenize=True, return_dict=True)  # fmt: skip
    return list(out["input_ids"])


def _add_schema() -> dict[str, Any]:
    from agentrl.tools import Tool

    return Tool(add).schema["function"]


def assert_token_record(traj: Trajectory, client: FamilyClient, tokenizer: Any) -> None:
    """token_ids = the sampled tokens, exactly, plus the template's own renderings."""
    ids = list(traj.token_ids)
    spans = list(traj.spans)
    assert spans[0].start == 0 and spans[-1].end == len(ids)
    assert all(a.end == b.start for a, b in itertools.pairwise(spans))
    sampled = [list(g.token_ids) for _, g in client.calls]
    assert [ids[s.start : s.end] for s in spans if s.kind == "assistant"] == sampled
    messages = traj.messages
    at = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    assert ids[: spans[0].end] == render(tokenizer, messages[: at[0]], True)
    eot = client.eot
    for turn, j in enumerate(at[:-1]):
        base = render(tokenizer, messages[: j + 1], False)
        full = render(tokenizer, messages[: at[turn + 1]], True)
        assert full[: len(base)] == base  # one segment: the template kept the prefix
        last_eot = max(i for i, t in enumerate(base) if t == eot)
        expected = base[last_eot + 1 :] + full[len(base) :]
        between = [s for s in spans if s.kind != "assistant" and s.turn == turn + 1]
        assert [t for s in between for t in ids[s.start : s.end]] == expected


async def test_a_tool_call_in_the_family_format_runs_and_comes_back(fam) -> None:
    f, tokenizer = fam
    chat = resolve_chat_format(tokenizer)
    assert chat.tools is not None
    replies = [thinking(f, CALLS[f.tool_format]), thinking(f, "Answer: 5")]
    (traj,), client, runner = await run_episode(tokenizer, f, replies)
    assert (traj.status, traj.reward) == ("finished", 1.0), traj.reason
    assert traj.env_log[1]["tool"] == "add" and traj.env_log[1]["result"] == "5"
    assert traj.env_log[2]["action"] == "Answer: 5"  # the env saw the answer, not the thinking
    text = tokenizer.decode(traj.token_ids, skip_special_tokens=False)
    assert RESULT_SHOWN[f.name] in text
    assert_token_record(traj, client, tokenizer)
    assert not any(k.startswith("tool_errors/") for k in runner.metrics.counters)


FAULTS = {
    "malformed": (MALFORMED, "malformed_json"),
    "cut-off": (CUT, "cut_off"),
    "unknown-tool": (UNKNOWN, "unknown_tool"),
    "bad-arguments": (BAD_ARGUMENTS, "bad_arguments"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_broken_calls_are_shown_and_counted_by_kind(fam, fault: str) -> None:
    f, tokenizer = fam
    replies_of, kind = FAULTS[fault]
    bad = thinking(f, replies_of[f.tool_format] + ("x" * 400 if fault == "cut-off" else ""))
    replies = [bad, thinking(f, CALLS[f.tool_format]), thinking(f, "Answer: 5")]
    (traj,), client, runner = await run_episode(tokenizer, f, replies, max_tokens=100)
    assert (traj.status, traj.reward) == ("finished", 1.0), traj.reason
    errors = {k: v for k, v in runner.metrics.counters.items() if k.startswith("tool_errors/")}
    assert errors == {f"tool_errors/{kind}": 1}
    first_assistant = next(i for i, m in enumerate(traj.messages) if m["role"] == "assistant")
    shown = traj.messages[first_assistant + 1]
    assert shown["content"].startswith("Error:"), shown
    if kind == "cut_off":
        assert client.calls[0][1].finish_reason == "length"
    ran = [(e["tool"], e["result"]) for e in traj.env_log if "tool" in e]
    assert ran == [("add", "5")]  # the broken call never ran; the good one did


@pytest.mark.parametrize("keep_thinking", [False, True])
async def test_qwen3_dropped_thinking_costs_a_segment_unless_kept(keep_thinking: bool) -> None:
    """Qwen3's template drops past thinking at a new user turn: a new segment (the whole
    conversation prefilled again) unless model.keep_thinking keeps the turns as sampled."""
    f = family("qwen3")
    tokenizer = build_tokenizer(f)
    replies = [thinking(f, CALLS["hermes"]), thinking(f, "Answer: 5"), thinking(f, "Answer: 8")]
    model = ModelConfig(keep_thinking=keep_thinking)
    trajs, client, runner = await run_episode(tokenizer, f, replies, model=model, follow_up=True)
    assert [t.reward for t in trajs][-1] == 2.0 and trajs[-1].status == "finished"
    counters = runner.metrics.counters
    sampled = [list(g.token_ids) for _, g in client.calls]
    got = [t.token_ids[s.start : s.end].tolist() for t in trajs for s in t.spans
           if s.kind == "assistant"]  # fmt: skip
    assert got == sampled  # every sampled token is in the record, thinking included
    if keep_thinking:
        assert len(trajs) == 1 and counters["template_new_segments"] == 0
        assert "I should add." in tokenizer.decode(trajs[0].token_ids[: trajs[0].spans[-1].start])
    else:
        assert len(trajs) == 2 and counters["template_new_segments"] == 1
        assert counters["template_reprefilled_tokens"] == len(trajs[1].token_ids) - len(sampled[-1])

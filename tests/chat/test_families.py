"""Real model families through the runner: each family's real chat template, vLLM's parser
for its tool-call format, scripted model output in that format.

For every family: the format and reasoning are detected from the template; a tool call
written the family's way runs the tool, its result comes back the way the template shows
it, and the token record is exactly the sampled tokens plus the template's renderings;
each kind of broken call (malformed, cut off, unknown tool, bad arguments) is shown to
the model and counted under its kind.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentrl.chat.formats import resolve_chat_format
from tests.models.families import (
    BAD_ARGUMENTS,
    CALLS,
    CUT,
    MALFORMED,
    NAMES,
    RESULT_SHOWN,
    UNKNOWN,
    assert_token_record,
    build_tokenizer,
    family,
    run_episode,
    thinking,
)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module", params=NAMES)
def fam(request: pytest.FixtureRequest) -> Any:
    f = family(request.param)
    return f, build_tokenizer(f)


def test_format_and_reasoning_are_detected_from_the_template(fam) -> None:
    f, tokenizer = fam
    chat = resolve_chat_format(tokenizer)
    assert chat.tools is not None and chat.tools.name == f.tool_format
    assert (chat.reasoning.name if chat.reasoning else None) == f.reasoning
    for token in f.special_tokens:  # one token each, as in the real tokenizer
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token


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

"""Trajectory invariants, and rendering conversations to tokens without drift."""

from __future__ import annotations

import math

import numpy as np
import pytest
from transformers import AutoTokenizer

from agentrl.chat import Conversation
from agentrl.types import FailureKind, RequestId, TokenSpan, Trajectory


def _trajectory(**overrides: object) -> Trajectory:
    fields: dict[str, object] = dict(
        episode_id="e",
        task_id="t",
        env_id="x",
        seed=0,
        token_ids=[1, 2, 3, 4],
        logprobs=[math.nan, -0.5, -0.1, math.nan],
        versions=[-1, 0, 1, -1],
        loss_mask=[0, 1, 1, 0],
        spans=(
            TokenSpan("prompt", 0, 1, 0),
            TokenSpan("assistant", 1, 3, 0),
            TokenSpan("env", 3, 4, 1),
        ),
        messages=[],
        turn_rewards=[1.0],
        reward=1.0,
        status="finished",
    )
    fields.update(overrides)
    return Trajectory(**fields)  # type: ignore[arg-type]


def test_trajectory_invariants_name_what_is_wrong() -> None:
    t = _trajectory()
    assert t.num_sampled == 2 and t.min_version() == 0 and t.token_ids.dtype == np.int32
    again = Trajectory.from_json(t.to_json())
    assert again.token_ids.tolist() == t.token_ids.tolist() and again.spans == t.spans
    assert np.isnan(again.logprobs[0]) and again.logprobs[1] == pytest.approx(-0.5)
    cases = {
        "differ in length": dict(versions=[-1, 0, 1]),
        "have no policy version": dict(versions=[-1, -1, 1, -1]),
        "carry a version": dict(versions=[0, 0, 1, -1]),
        "versions decrease": dict(versions=[-1, 1, 0, -1]),
        "NaN or positive logprob": dict(logprobs=[math.nan, math.nan, -0.1, math.nan]),
        "non-sampled token has a logprob": dict(logprobs=[-1.0, -0.5, -0.1, math.nan]),
        "disagrees with loss_mask": dict(
            spans=(
                TokenSpan("prompt", 0, 2, 0),
                TokenSpan("assistant", 2, 3, 0),
                TokenSpan("env", 3, 4, 1),
            )
        ),
        "does not start where": dict(
            spans=(TokenSpan("prompt", 0, 1, 0), TokenSpan("assistant", 2, 3, 0))
        ),
        "spans cover 3 tokens of 4": dict(
            spans=(TokenSpan("prompt", 0, 1, 0), TokenSpan("assistant", 1, 3, 0))
        ),
        "spans cover 5 tokens of 4": dict(
            spans=(
                TokenSpan("prompt", 0, 1, 0),
                TokenSpan("assistant", 1, 3, 0),
                TokenSpan("env", 3, 5, 1),
            )
        ),
        "status": dict(status="done"),
        "with failure kind": dict(failure=FailureKind.ENV_TIMEOUT),  # but status finished
    }
    for message, bad in cases.items():
        with pytest.raises(ValueError, match=message):
            _trajectory(**bad)
        # From a trajectory of one policy version, which the quick proof takes on
        with pytest.raises(ValueError, match=message):
            _trajectory(**{"versions": [-1, 0, 0, -1], **bad})
    assert _trajectory(versions=[-1, 0, 0, -1])._plainly_valid()
    assert not t._plainly_valid()  # two versions: the checks one by one


def _random_trajectory(rng: np.random.Generator) -> Trajectory:
    """A valid trajectory of random spans, one policy version (or two, a quarter of them)."""
    kinds = ["prompt"] + [str(k) for k in rng.choice(["assistant", "env", "tool"], 7)]
    spans, position = [], 0
    for turn, kind in enumerate(kinds):
        length = int(rng.integers(0 if turn else 1, 6))
        spans.append(TokenSpan(kind, position, position + length, turn))  # type: ignore[arg-type]
        position += length
    mask = np.repeat([int(s.sampled) for s in spans], [s.end - s.start for s in spans])
    version = int(rng.integers(0, 3))
    versions = np.where(mask == 1, version, -1)
    if rng.random() < 0.25:
        versions[mask == 1] += np.arange(int(mask.sum())) >= mask.sum() // 2
    return _trajectory(
        token_ids=rng.integers(0, 100, position),
        loss_mask=mask,
        versions=versions,
        logprobs=np.where(mask == 1, -rng.random(position), np.nan),
        spans=tuple(spans),
    )


def test_the_quick_proof_of_validity_never_passes_a_defect() -> None:
    """``_plainly_valid`` is a shortcut of ``validate``: wherever it says valid, the
    checks one by one must agree. Random trajectories, each given one random defect (or
    none): a span moved, a mask byte, a version, a logprob, the status, the reward."""
    rng = np.random.default_rng(0)
    proven = defects_refused = 0

    def corrupt(t: Trajectory) -> None:
        n, what = len(t), int(rng.integers(0, 12))
        i = int(rng.integers(0, n))
        if what == 0:
            t.loss_mask[i] = 1 - t.loss_mask[i]
        elif what == 1:
            t.loss_mask[i] = rng.choice([2, -1, 127])
        elif what == 2:
            t.versions[i] = rng.choice([-2, -1, 0, 1, 5])
        elif what == 3:
            t.logprobs[i] = rng.choice([np.nan, 0.5, np.inf, -np.inf, -0.25])
        elif what == 4 and len(t.spans) > 1:
            k = int(rng.integers(1, len(t.spans)))
            s = t.spans[k]
            moved = TokenSpan(s.kind, s.start + int(rng.choice([-1, 1])), s.end, s.turn)
            t.spans = (*t.spans[:k], moved, *t.spans[k + 1 :])
        elif what == 5:
            t.spans = t.spans[:-1]
        elif what == 6:
            t.status = "done"  # type: ignore[assignment]
        elif what == 7:
            t.reward = math.inf
        elif what == 8:
            t.failure = FailureKind.ENV_TIMEOUT
        # else: no defect

    for _ in range(3000):
        t = _random_trajectory(rng)
        single = len(set(t.versions[t.loss_mask == 1].tolist())) == 1
        assert t._plainly_valid() == single  # the usual case is taken on
        corrupt(t)
        try:
            t._check_each_invariant()
        except ValueError:
            defects_refused += 1
            assert not t._plainly_valid(), (t.spans, t.loss_mask, t.versions, t.logprobs)
            with pytest.raises(ValueError):
                t.validate()
        else:
            proven += t._plainly_valid()
    assert proven > 500 and defects_refused > 1000, (proven, defects_refused)


def test_a_failure_kind_is_a_field_and_survives_json() -> None:
    t = _trajectory(status="failed", failure="env_timeout", reason="env_timeout: step ...")
    assert (
        t.failure is FailureKind.ENV_TIMEOUT and f"failures/{t.failure}" == "failures/env_timeout"
    )
    assert Trajectory.from_json(t.to_json()).failure is FailureKind.ENV_TIMEOUT
    assert _trajectory().failure is None
    with pytest.raises(ValueError, match="not a valid FailureKind"):
        _trajectory(status="failed", failure="env_on_fire")


def test_request_ids_are_built_and_parsed_by_one_type() -> None:
    for episode_id in ("e", "agentrl.GuessNumber-v0#3/1", "a-b-c", "t#0/0-retry"):
        rid = RequestId(episode_id, 17)
        assert rid.format() == str(rid) == f"{episode_id}-17"
        assert RequestId.parse(rid.format()) == rid
    for bad in ("no-serial-", "plain", "-5", "e-x1", "e-1.0", "e-\u0663"):
        with pytest.raises(ValueError, match="not a request id"):
            RequestId.parse(bad.encode().decode("unicode_escape"))
    with pytest.raises(ValueError, match="negative"):
        RequestId("e", -1)


def _sample(conv: Conversation, tokenizer, text: str, *, cut: bool = False) -> list[int]:
    """Append a turn the way the runner does: ids as 'sampled', never re-tokenized."""
    ids = tokenizer.encode(text) + ([] if cut else [tokenizer.convert_tokens_to_ids("<|im_end|>")])
    conv.add_sampled(ids, [-0.5] * len(ids), [3] * len(ids))
    conv.end_assistant_turn(conv.decode(ids), "length" if cut else "stop")
    return ids


def test_tokens_are_prompt_plus_sampled_plus_rendered_deltas(tokenizer) -> None:
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {}}}]
    start = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}]
    conv = Conversation(tokenizer, start, tools=tools)
    pieces = [list(conv.token_ids)]
    pieces.append(_sample(conv, tokenizer, '<tool_call>{"name": "calculator"}</tool_call>'))
    assert conv.add_messages([{"role": "tool", "name": "calculator", "content": "5"}], "tool")
    pieces.append(conv.token_ids[sum(map(len, pieces)) :])
    pieces.append(_sample(conv, tokenizer, "Answer: 5"))
    assert conv.add_messages([{"role": "user", "content": "Sure?"}], "env")
    assert conv.token_ids[: sum(map(len, pieces))] == [t for p in pieces for t in p]
    # With a prefix-preserving template and sampled ids equal to the template's own
    # tokens, the incremental sequence equals one full rendering of the conversation.
    assert conv.token_ids == conv.render(conv.messages, add_generation_prompt=True)
    assert [s.kind for s in conv.current.spans] == [
        "prompt",
        "assistant",
        "tool",
        "assistant",
        "env",
    ]
    assert conv.segments_started == 0


def test_sampled_tokens_are_kept_even_when_retokenizing_differs(tokenizer) -> None:
    # Find sampled ids the tokenizer would merge differently: "ab" sampled as "a" + "b".
    word = next(w for w in (" the", " number", " answer") if len(tokenizer.encode(w)) == 1)
    split = [tokenizer.convert_tokens_to_ids(c) for c in tokenizer.tokenize(word)[0]]
    assert tokenizer.encode(tokenizer.decode(split)) != split  # re-tokenizing would drift
    conv = Conversation(tokenizer, [{"role": "user", "content": "Hi"}])
    sampled = [*split, tokenizer.convert_tokens_to_ids("<|im_end|>")]
    conv.add_sampled(sampled, [-0.1] * len(sampled), [0] * len(sampled))
    conv.end_assistant_turn(conv.decode(sampled), "stop")
    before = list(conv.token_ids)
    assert conv.add_messages([{"role": "user", "content": "Again"}], "env")
    assert conv.token_ids[: len(before)] == before  # the sampled ids stay exactly as sampled
    assert conv.token_ids != conv.render(conv.messages, add_generation_prompt=True)
    assert conv.segments_started == 0


def test_a_turn_cut_by_the_length_limit_is_closed_by_the_template_tokens(tokenizer) -> None:
    conv = Conversation(tokenizer, [{"role": "user", "content": "Hi"}])
    _sample(conv, tokenizer, "partial ans", cut=True)
    n = len(conv.token_ids)
    assert conv.add_messages([{"role": "user", "content": "Go on"}], "env")
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert conv.token_ids[n] == im_end  # the env span starts by closing the turn
    assert conv.token_ids == conv.render(conv.messages, add_generation_prompt=True)


def test_a_template_that_rewrites_history_starts_a_new_segment(tokenizer) -> None:
    # A "thinking" template: earlier assistant turns lose their <think> part.
    template = tokenizer.chat_template.replace(
        "{%- if m.content %}{{ m.content }}{% endif %}",
        "{%- if m.content %}{% if loop.last %}{{ m.content }}"
        "{% else %}{{ m.content.split('</think>')[-1] }}{% endif %}{% endif %}",
    )
    assert template != tokenizer.chat_template
    tokenizer = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    tokenizer.chat_template = template
    conv = Conversation(tokenizer, [{"role": "user", "content": "Hi"}])
    _sample(conv, tokenizer, "<think>hmm</think>Hello")
    assert conv.add_messages([{"role": "user", "content": "And?"}], "env")
    assert conv.segments_started == 1 and len(conv.segments) == 2
    assert conv.current.loss_mask == [0] * len(conv.current.token_ids)  # all prompt
    assert conv.token_ids == conv.render(conv.messages, add_generation_prompt=True)
    assert conv.segments[0].loss_mask.count(1) > 0


def test_context_limit_refuses_a_delta_that_does_not_fit(tokenizer) -> None:
    conv = Conversation(tokenizer, [{"role": "user", "content": "Hi"}])
    _sample(conv, tokenizer, "Hello")
    n = len(conv)
    assert not conv.add_messages([{"role": "user", "content": "x " * 300}], "env", max_len=n + 20)
    assert len(conv) == n and conv.messages[-1]["role"] == "assistant"


def test_progress_counts_sampled_tokens_per_policy_version() -> None:
    """The live view's count of an episode's sampled tokens by version: turns of one
    version (the usual case) and turns that straddle a weight update."""
    from agentrl.rollout.episode import EpisodeProgress

    progress = EpisodeProgress("e/0", "bench/Echo-v0")
    progress.add_tokens((0,) * 32)
    progress.add_tokens(())
    progress.add_tokens([0, 0, 1, 1, 1])
    progress.add_tokens((2,))
    progress.add_tokens((1, 2, 2))
    assert progress.sampled == 32 + 5 + 1 + 3
    assert progress.tokens_by_version == {0: 34, 1: 4, 2: 3}

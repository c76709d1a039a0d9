"""The values both vLLM clients share (agentrl.inference.base); no vLLM is started."""

from __future__ import annotations

import numpy as np
import pytest

from agentrl.inference.base import token_list

pytestmark = [pytest.mark.timeout(60)]


def test_a_prompt_reaches_the_engine_as_a_new_list_of_python_ints() -> None:
    """Whatever sequence of integers the caller gives (the rollout loop's lists, a tuple,
    numpy's arrays and scalars, bools), the engine gets a list of exact Python ints equal
    to them, never the caller's own list (the caller may append to it meanwhile)."""
    ids = [151644, 872, 198, 0]
    out = token_list(ids)
    assert out == ids and out is not ids
    out.append(1)
    assert ids == [151644, 872, 198, 0]
    for given in (
        tuple(ids),
        np.array(ids, np.int32),
        np.array(ids, np.int64),
        [np.int64(151644), 872, np.int32(198), 0],
        list(np.array(ids)),
    ):
        out = token_list(given)
        assert out == ids and {type(t) for t in out} == {int}, given
    assert token_list([True, False, 2]) == [1, 0, 2]
    assert {type(t) for t in token_list([True, 2])} == {int}
    assert token_list([]) == []


def test_sampled_logprobs_read_vllm_flat_logprobs_as_its_per_token_dicts() -> None:
    """The flat container (one entry a position with ``logprobs=0``) gives its list as it
    is, without building a Logprob per token; vLLM's list of dicts, or a flat container
    with other tokens in it, is read position by position as before."""
    from vllm.logprobs import FlatLogprobs, append_logprobs_for_next_position

    from agentrl.inference.engine import _sampled_logprobs

    ids, values = [11, 12, 13], [-0.25, -1.5, -0.125]

    def container(flat: bool, entries: list[tuple[list[int], list[float]]]) -> object:
        c: object = FlatLogprobs() if flat else []
        for toks, lps in entries:
            append_logprobs_for_next_position(c, toks, lps, [None] * len(toks), 1, len(toks) - 1)
        return c

    one_each = [([t], [v]) for t, v in zip(ids, values, strict=True)]
    flat, dicts = container(True, one_each), container(False, one_each)
    assert _sampled_logprobs(ids, dicts) == values
    # the flat list itself: indexing a position (which builds Logprob objects) is not used
    original = FlatLogprobs.__getitem__
    FlatLogprobs.__getitem__ = None  # type: ignore[assignment,method-assign]
    try:
        assert _sampled_logprobs(ids, flat) == values
    finally:
        FlatLogprobs.__getitem__ = original  # type: ignore[method-assign]
    # top-k entries besides the sampled one: the sampled token's logprob, by position
    with_topk = container(True, [([t, 99], [v, -9.0]) for t, v in zip(ids, values, strict=True)])
    assert _sampled_logprobs(ids, with_topk) == values
    # a position without the sampled token still fails loudly
    with pytest.raises(KeyError):
        _sampled_logprobs([11, 12, 14], flat)
    assert _sampled_logprobs([], FlatLogprobs()) == []
    assert _sampled_logprobs([], None) == []

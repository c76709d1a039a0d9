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
    for given in (tuple(ids), np.array(ids, np.int32), np.array(ids, np.int64),
                  [np.int64(151644), 872, np.int32(198), 0], list(np.array(ids))):  # fmt: skip
        out = token_list(given)
        assert out == ids and {type(t) for t in out} == {int}, given
    assert token_list([True, False, 2]) == [1, 0, 2]
    assert {type(t) for t in token_list([True, 2])} == {int}
    assert token_list([]) == []

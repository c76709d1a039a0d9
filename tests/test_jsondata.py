"""``jsonable``: every writer of JSON (env info, status, metrics, checkpoints, replay) gets
plain JSON data back, whatever Python or numpy values it held."""

from __future__ import annotations

import enum
import json
import math
from pathlib import Path

import numpy as np
import pytest

from agentrl.jsondata import jsonable

pytestmark = pytest.mark.timeout(10)


class Colour(enum.Enum):
    RED = "red"


class Opaque:
    def __repr__(self) -> str:
        return "<opaque>"


def test_values_become_plain_json_recursively() -> None:
    value = {
        1: (np.float32(0.5), np.int64(3), np.bool_(True)),
        "arr": np.arange(3, dtype=np.int32),
        "nested": {"path": Path("/tmp/x"), "colour": Colour.RED, "set": {2}},
        "other": Opaque(),
        "none": None,
    }
    out = jsonable(value)
    assert out == {
        "1": [0.5, 3, True],
        "arr": [0, 1, 2],
        "nested": {"path": "/tmp/x", "colour": "red", "set": [2]},
        "other": "<opaque>",
        "none": None,
    }
    assert json.loads(json.dumps(out, allow_nan=False)) == out
    assert isinstance(out["1"][1], int) and isinstance(out["1"][2], bool)


def test_nan_is_kept_or_becomes_null() -> None:
    arr = np.array([1.0, np.nan, np.inf], dtype=np.float32)
    kept = jsonable({"x": arr})["x"]
    assert kept[0] == 1.0 and math.isnan(kept[1]) and kept[2] == math.inf
    assert jsonable({"x": arr}, allow_nan=False) == {"x": [1.0, None, None]}
    assert jsonable(float("nan"), allow_nan=False) is None


def test_the_input_is_not_changed() -> None:
    info = {"k": [1, (2, 3)]}
    assert jsonable(info) == {"k": [1, [2, 3]]}
    assert info == {"k": [1, (2, 3)]}

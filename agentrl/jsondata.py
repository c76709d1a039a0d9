"""``jsonable``: any value as plain JSON data, the one conversion every writer of JSON uses.

Env ``info`` dicts (stored with an episode, sent over the env-server wire), status and
metrics files, trainer checkpoints and replay dumps all turn Python values into JSON
with :func:`jsonable`. It owns only that conversion, not where the JSON goes.

This module imports only the standard library (numpy values are recognised by their
``item``/``tolist`` methods, without importing numpy).
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Mapping
from typing import Any

_PLAIN = (str, int, bool, type(None))


def jsonable(value: Any, *, allow_nan: bool = True) -> Any:
    """``value`` as plain JSON data (what ``json.dumps`` writes without a ``default``).

    Mappings become dicts with string keys; lists, tuples and sets become lists; numpy
    scalars and arrays become Python numbers and lists; a path becomes its string, an
    enum member its value; anything else JSON cannot hold becomes its ``repr``.

    Args:
        value: what to convert (it is not changed).
        allow_nan: keep NaN and infinities (Python's JSON reads and writes them); False:
            they become ``None`` (``null``), for readers that hold strictly to JSON.
    """
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, float):
        return value if allow_nan or math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): jsonable(v, allow_nan=allow_nan) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v, allow_nan=allow_nan) for v in value]
    if isinstance(value, enum.Enum):
        return jsonable(value.value, allow_nan=allow_nan)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    for method in ("tolist", "item"):  # numpy arrays, numpy and torch scalars
        convert = getattr(value, method, None)
        if callable(convert):
            try:
                plain = convert()
            except (TypeError, ValueError):  # e.g. item() of a tensor of many values
                continue
            if plain is not value:
                return jsonable(plain, allow_nan=allow_nan)
    return repr(value)

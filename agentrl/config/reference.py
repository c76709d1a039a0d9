"""The config reference: every key with its default and its one-line doc, as TOML.

``agentrl config --defaults`` prints :func:`defaults_toml`; the docs site's reference is
built from the same tree (``scripts/gen_ref_pages.py``, ``tests/docs/test_reference.py``).
The docs are the strings written under each field in :mod:`agentrl.config.sections`
(and :mod:`~agentrl.config.training`, :mod:`~agentrl.config.health`, ...)
(read from the source with :mod:`ast`, so the classes stay plain dataclasses).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import textwrap
import typing
from typing import Any

from agentrl.config import cluster, health, sections, training
from agentrl.config.loader import RunConfig, _toml_value


@functools.cache
def field_docs() -> dict[tuple[str, str], str]:
    """``(class name, field name) -> doc`` for every documented field of the tree."""
    docs: dict[tuple[str, str], str] = {}
    for module in (sections, training, health, cluster, inspect.getmodule(RunConfig)):
        tree = ast.parse(inspect.getsource(module))  # type: ignore[arg-type]
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            body = cls.body
            for stmt, after in itertools.pairwise(body):
                if (
                    isinstance(stmt, ast.AnnAssign)
                    and isinstance(stmt.target, ast.Name)
                    and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)
                ):
                    docs[(cls.name, stmt.target.id)] = " ".join(after.value.value.split())
    return docs


def defaults_toml() -> str:
    """The full default config as TOML, each key under its doc as a comment."""
    lines = [
        "# agentrl: every config key with its default (agentrl config --defaults).",
        "# Set only what you change; unknown keys are refused.",
    ]
    _section(RunConfig(), "", lines)
    return "\n".join(lines) + "\n"


def _section(obj: Any, path: str, lines: list[str]) -> None:
    docs = field_docs()
    cls = type(obj)
    hints = typing.get_type_hints(cls)
    nested = []
    if path:
        lines.append("")
        if cls.__doc__:
            lines.append("# " + cls.__doc__.strip().splitlines()[0].replace("``", ""))
        lines.append(f"[{path}]")
    for f in dataclasses.fields(cls):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            nested.append((f.name, value))
            continue
        doc = docs.get((cls.__name__, f.name), "")
        for line in textwrap.wrap(doc, 88) or [""]:
            if line:
                lines.append(f"# {line}")
        shown = _toml_value(value) if value is not None else None
        kind = _type_name(hints[f.name])
        lines.append(f"# {f.name} = ({kind}) unset" if shown is None else f"{f.name} = {shown}")
    for name, value in nested:
        _section(value, f"{path}.{name}" if path else name, lines)


def _type_name(hint: Any) -> str:
    text = str(hint).replace("typing.", "")
    return text.replace("<class '", "").replace("'>", "")


def default_of(key: str) -> Any:
    """The default of a dotted key (``rollout.group_size`` -> 8)."""
    node: Any = RunConfig()
    for part in key.split("."):
        node = getattr(node, part)
    return node

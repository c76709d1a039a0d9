"""The generated reference pages list every command, flag and config key the code defines."""

from __future__ import annotations

import argparse
import dataclasses
import html
import re

import pytest

from tests.docs.conftest import BuiltSite

pytestmark = pytest.mark.timeout(300)


def _sections(page: str, marker: str) -> dict[str, str]:
    """The page cut at each heading id starting with ``marker`` (``agentrl-train`` -> its HTML)."""
    parts = re.split(rf'<h2 id="{marker}', page)
    return {part.split('"', 1)[0]: part for part in parts[1:]}


def test_the_cli_reference_lists_every_command_and_flag(built_site: BuiltSite) -> None:
    from agentrl.cli import COMMANDS, _parser

    page = html.unescape(built_site.page("reference/cli.md"))
    sections = _sections(page, "agentrl-")
    subparsers = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(subparsers.choices) == set(COMMANDS)
    for name, sub in subparsers.choices.items():
        assert name in sections, f"agentrl {name} has no section in the CLI reference"
        for action in sub._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"<code>{flag}</code>" in sections[name], f"agentrl {name} {flag}"
            if not action.option_strings:  # a positional
                shown = f"<code>{action.dest}</code>"
                assert shown in sections[name], f"agentrl {name} {action.dest}"
    assert "<code>--verbose</code>" in page


def _keys(obj: object, path: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, f.name)
        dotted = f"{path}.{f.name}" if path else f.name
        keys += _keys(value, dotted) if dataclasses.is_dataclass(value) else [dotted]
    return keys


def test_the_config_reference_lists_every_key_with_its_default_and_doc(
    built_site: BuiltSite,
) -> None:
    from agentrl.config.loader import RunConfig
    from agentrl.config.reference import default_of, field_docs

    page = html.unescape(built_site.page("reference/config.md"))
    keys = _keys(RunConfig())
    assert len(keys) > 100
    row = re.compile(r"<tr>\s*<td><code>([\w.]+)</code></td>.*?</tr>", re.S)
    rows = {m.group(1): m.group(0) for m in row.finditer(page)}
    missing = [k for k in keys if k not in rows]
    assert not missing, f"config keys missing from the reference: {missing}"
    assert rows["rollout.group_size"].count(str(default_of("rollout.group_size"))) >= 1
    doc = field_docs()[("RolloutConfig", "group_size")]
    assert doc.split()[0] in rows["rollout.group_size"]


def test_the_api_reference_renders_docstrings(built_site: BuiltSite) -> None:
    page = built_site.page("reference/api.md")
    for name in ("TextEnv", "EpisodeStore", "RunConfig", "Trainer", "check_env"):
        assert name in page, name
    assert "::: agentrl" not in page, "a mkdocstrings directive was left unrendered"

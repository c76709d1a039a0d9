"""Every command's help text is for users: metavars name the value, not an internal key."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from agentrl.cli import COMMANDS, _parser


def _every_parser() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    top = _parser()
    yield "agentrl", top
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"agentrl {name}", sub


@pytest.mark.timeout(60)
def test_no_help_text_shows_an_internal_key_as_metavar() -> None:
    seen = dict(_every_parser())
    assert set(COMMANDS) <= {name.split()[-1] for name in seen}  # every command walked
    for name, parser in seen.items():
        text = parser.format_help()
        bad = re.findall(r"\S*KEY:\S*", text)
        assert not bad, f"`{name} --help` shows {bad}"
        assert "agentrl/config.py" not in text, f"`{name} --help` names a file that is gone"


@pytest.mark.timeout(60)
def test_shortcut_flags_name_their_values() -> None:
    parsers = dict(_every_parser())
    rollout = parsers["agentrl rollout"].format_help()
    assert "--group-size N" in rollout and "--temperature X" in rollout
    assert "--model MODEL" in rollout
    assert "--episodes N" in parsers["agentrl eval"].format_help()
    assert "agentrl config --defaults" in parsers["agentrl train"].format_help()

"""The flags the command parsers share and the ``--section.key=value`` config overrides.

:func:`_shortcut` makes a flag that sets one config key, :func:`_overrides` turns the
overrides and those flags into the list :meth:`agentrl.config.RunConfig.load` reads,
:func:`_import_flag` is ``--import``. :mod:`agentrl.cli.parsers` re-exports them.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
else:
    Subparsers = Any


def _import_flag(parser: argparse.ArgumentParser, text: str) -> None:
    """``--import MODULE_OR_FILE`` (repeatable): modules that register the user's envs."""
    parser.add_argument(
        "--import", dest="imports", action="append", default=[], metavar="MODULE_OR_FILE", help=text
    )


def _shortcut(parser: argparse.ArgumentParser, flag: str, key: str, kind: type, text: str) -> None:
    """A flag that sets one config key; its default is the config tree's."""
    from agentrl.config.reference import default_of

    metavar = {int: "N", float: "X"}.get(kind, flag.lstrip("-").upper())  # not dest's KEY:...
    parser.add_argument(
        flag,
        type=kind,
        default=None,
        dest=f"key:{key}",
        metavar=metavar,
        help=f"{text} (sets {key}; default {default_of(key)!r})",
    )


def _checked_overrides(extra: Sequence[str]) -> list[str]:
    """The ``--section.key=value`` overrides, refusing anything else."""
    from agentrl.errors import ConfigError

    bad = [o for o in extra if not o.startswith("--") or "=" not in o]
    if bad:
        raise ConfigError(
            f"unrecognized argument {bad[0]!r}; overrides look like --section.key=value"
        )
    return list(extra)


def _overrides(args: argparse.Namespace, extra: Sequence[str]) -> list[str]:
    """``--section.key=value`` overrides, then the shortcut flags given."""
    flags = [
        f"--{k[4:]}={json.dumps(v)}"
        for k, v in vars(args).items()
        if k.startswith("key:") and v is not None
    ]
    return [*_checked_overrides(extra), *flags]

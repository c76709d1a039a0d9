"""Generate the docs site's reference pages from the code, at build time.

Run by mkdocs-gen-files (``mkdocs.yml``, ``plugins: gen-files``) on every ``mkdocs
build``; nothing it writes is committed, so a page cannot drift from the code:

- ``reference/cli.md``: every ``agentrl`` command and flag, read from the argparse
  parsers (:func:`agentrl.cli._parser`), with each flag's default and help;
- ``reference/config.md``: every config key with its type, default and doc line, read
  from the config tree (:mod:`agentrl.config.reference`, the machinery of
  ``agentrl config --defaults``);
- ``reference/api.md``: the public Python API, rendered by mkdocstrings from docstrings;
- ``benchmarks.md``: every figure in ``benchmarks/results/*.json`` with its method,
  machine, commit and date (``benchmarks/docs_page.py``).

``python scripts/gen_ref_pages.py OUT_DIR`` writes the same pages into a folder, to read
them without building the site.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's sources, also when agentrl is installed

API_MODULES = [
    ("Top level", ["agentrl"]),
    (
        "Environments and tools",
        [
            "agentrl.env",
            "agentrl.adapter",
            "agentrl.dataset_env",
            "agentrl.tools",
            "agentrl.tools.mcp",
            "agentrl.check",
        ],
    ),
    ("Values and errors", ["agentrl.types", "agentrl.errors", "agentrl.protocols"]),
    ("Configuration", ["agentrl.config.loader", "agentrl.config.sections"]),
    ("Inference", ["agentrl.inference"]),
    (
        "Rollouts",
        [
            "agentrl.rollout.runner",
            "agentrl.rollout.scheduler",
            "agentrl.rollout.controller",
            "agentrl.queue",
        ],
    ),
    ("The episode store", ["agentrl.store"]),
    (
        "Training",
        [
            "agentrl.trainer.trainer",
            "agentrl.trainer.stepstats",
            "agentrl.trainer.loop",
            "agentrl.trainer.publish",
            "agentrl.trainer.losses",
        ],
    ),
    ("Runs", ["agentrl.run"]),
]
"""The public API page: (section, modules). A module here is rendered with its public members."""


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _flag_row(action: argparse.Action) -> str:
    names = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}`"
    if action.option_strings and action.nargs != 0:
        metavar = action.metavar or action.dest.upper()
        names += f" `{metavar if isinstance(metavar, str) else ' '.join(metavar)}`"
    default = action.default
    shown = "" if default in (None, argparse.SUPPRESS, False) or action.nargs == 0 else default
    kind = "flag" if action.nargs == 0 else ("positional" if not action.option_strings else "")
    text = (action.help or "").replace("%(default)s", str(default))
    if action.choices:
        text += f" (one of: {', '.join(map(str, action.choices))})"
    return f"| {names} | {kind} | {_escape(str(shown)) and f'`{shown}`'} | {_escape(text)} |"


def cli_page() -> str:
    """Every command of ``agentrl`` with every flag, from its argparse parser."""
    from agentrl.cli import COMMANDS, _parser

    parser = _parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in subparsers._choices_actions}
    lines = [
        "# CLI reference",
        "",
        "Generated from the argparse parsers of `agentrl` (`agentrl/cli/parsers.py`) at "
        "build time: every command and flag the code defines. `agentrl COMMAND --help` "
        "prints the same.",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    for n in COMMANDS:
        lines.append(f"| [`agentrl {n}`](#agentrl-{n}) | {_escape(helps.get(n) or '')} |")
    lines += ["", "Global flags (before the command):", "", *_flag_table(parser, skip_sub=True)]
    for name, sub in subparsers.choices.items():
        lines += ["", f"## `agentrl {name}` {{#agentrl-{name}}}", ""]
        desc = sub.description or helps.get(name) or ""
        if desc:
            lines += [_escape(desc), ""]
        lines += ["```text", sub.format_usage().strip().removeprefix("usage: "), "```", ""]
        lines += _flag_table(sub, skip_sub=False)
        if COMMANDS[name].overrides:
            lines += [
                "",
                "Also takes `--section.key=value` for any key of the "
                "[configuration](config.md) (the value read as TOML).",
            ]
    return "\n".join(lines) + "\n"


def _flag_table(parser: argparse.ArgumentParser, *, skip_sub: bool) -> list[str]:
    rows = [
        _flag_row(a)
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
    ]
    if not rows:
        return ["(no flags)"]
    return ["| flag | kind | default | what it does |", "|---|---|---|---|", *rows]


def config_keys() -> Iterator[tuple[str, Any, str, str, Any]]:
    """``(section, class, key, type, default)`` for every leaf key of the config tree."""
    from agentrl.config.loader import RunConfig
    from agentrl.config.reference import _type_name

    def walk(obj: Any, path: str) -> Iterator[tuple[str, Any, str, str, Any]]:
        hints = typing.get_type_hints(type(obj))
        nested = []
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                nested.append((f.name, value))
                continue
            yield path, type(obj), f.name, _type_name(hints[f.name]), value
        for name, value in nested:
            yield from walk(value, f"{path}.{name}" if path else name)

    yield from walk(RunConfig(), "")


def config_page() -> str:
    """Every config key with its type, default and doc line, one table per section."""
    from agentrl.config.loader import _toml_value
    from agentrl.config.reference import field_docs

    docs = field_docs()
    lines = [
        "# Configuration reference",
        "",
        "Generated from the config tree (`agentrl/config/sections.py`) at build time: "
        "every key `agentrl train`, `rollout`, `eval` and `serve` read, with its type, "
        "default and the doc line written under it in the code. Set keys in a TOML file "
        "(`[section]` tables) or on the command line as `--section.key=value`; "
        "`agentrl config --defaults` prints all of them as TOML. Unknown keys are "
        "refused, naming the key.",
    ]
    section = None
    for path, cls, key, kind, value in config_keys():
        if path != section:
            section = path
            head = (cls.__doc__ or "").strip().splitlines()[0].replace("``", "`")
            lines += [
                "",
                f"## `[{path}]`",
                "",
                _escape(head),
                "",
                "| key | type | default | what it does |",
                "|---|---|---|---|",
            ]
        default = "unset" if value is None else f"`{_escape(_toml_value(value))}`"
        doc = docs.get((cls.__name__, key), "").replace("``", "`")
        lines.append(f"| `{path}.{key}` | `{_escape(kind)}` | {default} | {_escape(doc)} |")
    return "\n".join(lines) + "\n"


def api_page() -> str:
    """mkdocstrings directives for the public modules (rendered from their docstrings)."""
    lines = [
        "# Python API reference",
        "",
        "Rendered from the docstrings of the code at build time (mkdocstrings). The "
        "guides show how the pieces fit; this page lists each public class and function "
        "of the modules a user imports.",
    ]
    for title, modules in API_MODULES:
        lines += ["", f"## {title}", ""]
        for module in modules:
            lines += [
                f"::: {module}",
                "    options:",
                "      heading_level: 3",
                "      show_submodules: false",
                "",
            ]
    return "\n".join(lines)


def benchmarks_page() -> str:
    from benchmarks.docs_page import page

    return page()


PAGES: dict[str, Callable[[], str]] = {
    "reference/cli.md": cli_page,
    "reference/config.md": config_page,
    "reference/api.md": api_page,
    "benchmarks.md": benchmarks_page,
}


def _write_with_gen_files() -> None:
    import mkdocs_gen_files

    for path, build in PAGES.items():
        with mkdocs_gen_files.open(path, "w") as f:
            f.write(build())


if __name__ == "__main__":  # by hand: python scripts/gen_ref_pages.py OUT_DIR
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/gen_ref_pages.py OUT_DIR")
    out = Path(sys.argv[1])
    for rel, build in PAGES.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(build())
else:  # run by mkdocs-gen-files (runpy) during a build
    _write_with_gen_files()

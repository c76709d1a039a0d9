"""``agentrl view``: serve the web viewer of runs (or write it as a static bundle).

The work is :mod:`agentrl.view`'s; this module reads the flags, prints the URL and
opens a browser.
"""

from __future__ import annotations

import argparse
import contextlib
import sys


def _view(args: argparse.Namespace, extra: list[str]) -> int:
    from pathlib import Path

    from agentrl.runtime.stopping import ensure_reaper, run_stoppable
    from agentrl.view import ViewData, new_token, serve, write_bundle

    data = ViewData(Path(args.root))
    if args.bundle:
        where = dict(_key_value(w) for w in args.where)
        n = write_bundle(
            data,
            Path(args.bundle),
            max_episodes=args.max_episodes,
            where=where,
            say=lambda line: print(line, flush=True),
        )
        print(f"wrote {n} episodes to {args.bundle}; open {Path(args.bundle) / 'index.html'}")
        return 0
    token = new_token(args.host)

    def ready(url: str) -> None:
        print(f"agentrl view: {url}  (Ctrl-C stops it)", flush=True)
        if token:
            print(
                "the token in the URL is required by every request; share it only with "
                "people who may read these runs",
                flush=True,
            )
        if not args.no_browser:
            import webbrowser

            # no browser here (or a broken one): the URL is printed above, that is enough
            with contextlib.suppress(Exception):
                webbrowser.open(url)

    if args.allow_fork:  # a fork's engine never outlives the viewer, even a SIGKILLed one
        ensure_reaper()
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C; SIGTERM/SIGHUP: Stopped, a subclass
        run_stoppable(serve(data, args.host, args.port, token, ready, allow_fork=args.allow_fork))
    print("agentrl view: stopped", file=sys.stderr)
    return 0


def _key_value(text: str) -> tuple[str, str]:
    from agentrl.errors import ConfigError

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"--where {text!r}: write KEY=VALUE, e.g. --where state=failed")
    return key, value

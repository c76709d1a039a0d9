"""``agentrl scan RUN``: the run's health warnings and the episodes that explain them.

The work is :mod:`agentrl.health.scan`'s; this module reads the flags and prints.
"""

from __future__ import annotations

import argparse
import json


def _scan(args: argparse.Namespace, extra: list[str]) -> int:
    from agentrl.errors import ConfigError
    from agentrl.health.detectors import DETECTORS
    from agentrl.health.scan import load_detector, scan_run

    names = list(DETECTORS) if args.only is None else args.only
    unknown = [n for n in [*names, *(args.skip or [])] if n not in DETECTORS]
    if unknown:
        raise ConfigError(
            f"no detector {unknown[0]!r}; the built-in ones are: {', '.join(DETECTORS)}"
        )
    chosen = {n: DETECTORS[n] for n in names if n not in (args.skip or [])}
    extra_detectors = [load_detector(spec) for spec in args.detector or []]
    report = scan_run(args.run_dir, detectors=chosen, extra=extra_detectors)
    if args.json:
        print(
            json.dumps(
                {
                    "run_dir": str(report.run_dir),
                    "steps": report.steps,
                    "episodes": report.episodes,
                    "warnings": [w.as_dict() for w in report.warnings],
                    "flagged": [f.as_dict(report.run_dir) for f in report.flagged],
                },
                indent=1,
            )
        )
        return 0
    print(
        f"health rules over {report.steps} steps of metrics.jsonl: {len(report.warnings)} warnings"
    )
    for w in report.warnings:
        print(f"  step {w.step}  {w.rule}: {w.message}")
    print(f"detectors over {report.episodes} episode attempts: {len(report.flagged)} flagged")
    for f in report.flagged[: args.limit]:
        print(f"  {f.episode_id} (attempt {f.attempt}, {f.status}, reward {f.reward:g})")
        for name, why in f.reasons:
            print(f"      {name}: {why}")
        print(f"      {f.replay_command(report.run_dir)}")
    if len(report.flagged) > args.limit:
        print(f"  ... and {len(report.flagged) - args.limit} more (--limit, or --json for all)")
    return 0

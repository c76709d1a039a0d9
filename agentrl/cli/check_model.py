"""``agentrl check-model MODEL``: the report of :mod:`agentrl.chat.modelcheck`, printed."""

from __future__ import annotations

import argparse

_MARK = {"ok": "OK  ", "note": "NOTE", "warn": "WARN", "error": "FAIL"}


def _check_model(args: argparse.Namespace, extra: list[str]) -> int:
    from transformers import AutoTokenizer

    from agentrl.chat.modelcheck import check_model, load_hf_config
    from agentrl.config import ModelConfig
    from agentrl.models import resolve_model

    path = resolve_model(args.model)
    settings = ModelConfig(
        path=args.model,
        tool_format=args.tool_format,
        reasoning=args.reasoning,
        keep_thinking=args.keep_thinking,
    )
    report = check_model(
        AutoTokenizer.from_pretrained(path),
        name=args.model,
        settings=settings,
        hf_config=load_hf_config(path),
    )
    print(f"{args.model} ({path})")
    for f in report.findings:
        print(f"{_MARK[f.level]}  {f.topic:<16} {f.found}")
        print(f"{'':<6}{'':<16} -> {f.action}")
    verdict = "tool calls can be trained" if report.ok else "agentrl train would stop"
    print(f"{args.model}: {verdict}")
    return 0 if report.ok else 1

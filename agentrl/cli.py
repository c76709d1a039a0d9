"""The ``agentrl`` command line: wiring only, no logic.

Commands:
    agentrl demo [--server] [--model SPEC]   build the tiny model, generate through real vLLM
    agentrl build-model [--cache-dir DIR]    build (or find) the tiny model, print its folder

This is the only place that calls ``asyncio.run``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections.abc import Sequence

from agentrl.errors import AgentRLError

logger = logging.getLogger("agentrl")

DEMO_QUESTIONS = ("What is 47 * 38?", "What is 512 + 89?", "What is 903 - 417?")
CALCULATOR_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 47*38"}},
            "required": ["expression"],
        },
    },
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentrl", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="show vLLM's logs")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="generate from the tiny model through real vLLM")
    demo.add_argument("--model", default="tiny", help="'tiny', a model folder, or a hub name")
    demo.add_argument("--server", action="store_true", help="go through `vllm serve` over HTTP")
    demo.add_argument("--max-tokens", type=int, default=48)

    build = commands.add_parser("build-model", help="build the tiny model and print its folder")
    build.add_argument("--cache-dir", default=None)

    check = commands.add_parser("check-env", help="run Gymnasium's and agentrl's env checks")
    check.add_argument("env_id", help="a registered id, e.g. agentrl/Calculator-v0")
    check.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE_OR_FILE",
        help="import this module or .py file first (where your env registers itself)",
    )

    roll = commands.add_parser(
        "rollout", help="run an env against a model for N episodes and record them"
    )
    roll.add_argument("env_id", help="a registered id, e.g. agentrl/GuessNumber-v0")
    roll.add_argument("--model", default="tiny", help="'tiny', a model folder, or a hub name")
    roll.add_argument("--episodes", type=int, default=64)
    roll.add_argument("--group-size", type=int, default=1, help="episodes per task (same seed)")
    roll.add_argument("--concurrency", type=int, default=64, help="episodes running at once")
    roll.add_argument("--max-turns", type=int, default=8)
    roll.add_argument("--max-tokens", type=int, default=64, help="per assistant turn")
    roll.add_argument("--temperature", type=float, default=1.0)
    roll.add_argument("--seed", type=int, default=0, help="seed of the first task")
    roll.add_argument("--server", action="store_true", help="go through `vllm serve` over HTTP")
    roll.add_argument("--out", default=None, help="run directory (default runs/rollout-TIME)")
    roll.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE_OR_FILE",
        help="import this first (registers your env)",
    )

    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        if args.command == "build-model":
            from agentrl.models.tiny import build_tiny_model

            print(build_tiny_model(cache_dir=args.cache_dir))
        elif args.command == "demo":
            asyncio.run(_demo(args.model, args.server, args.max_tokens))
        elif args.command == "check-env":
            return _check_env(args.env_id, args.imports)
        elif args.command == "rollout":
            return _rollout(args)
    except AgentRLError as e:
        print(f"agentrl: error: {e}", file=sys.stderr)
        return 1
    return 0


def _import_all(imports: Sequence[str]) -> None:
    import importlib
    import runpy

    for target in imports:
        if target.endswith(".py"):
            runpy.run_path(target, run_name="__agentrl_env__")
        else:
            importlib.import_module(target)


def _rollout(args: argparse.Namespace) -> int:
    from pathlib import Path

    from agentrl.rollout.job import RolloutJob, run_rollout

    _import_all(args.imports)
    out = Path(args.out or f"runs/rollout-{time.strftime('%Y%m%d-%H%M%S')}")
    job = RolloutJob(env_id=args.env_id, episodes=args.episodes, out_dir=out, model=args.model,
                     group_size=args.group_size, concurrency=args.concurrency,
                     via_server=args.server, first_seed=args.seed, max_turns=args.max_turns,
                     max_tokens_per_turn=args.max_tokens, temperature=args.temperature)  # fmt: skip
    summary = asyncio.run(run_rollout(job))
    lag = summary["metrics"].get("loop_lag_s/p99", float("nan"))
    rate = summary["success_rate"]
    print(f"{summary['episodes']} episodes of {args.env_id}: success {rate:.1%}, "
          f"{summary['tokens_per_s']:,.0f} tokens/s, loop lag p99 {lag * 1000:.0f} ms; "
          f"written to {out}")  # fmt: skip
    return 0


def _check_env(env_id: str, imports: Sequence[str]) -> int:
    from agentrl.check import check_env

    _import_all(imports)
    results = check_env(env_id, raise_on_failure=False)
    for r in results:
        print(f"{'PASS' if r.passed else 'FAIL'}  {r.rule:<20} {'' if r.passed else r.detail}")
    failed = [r.rule for r in results if not r.passed]
    print(
        f"{env_id}: "
        + (f"{len(failed)} rule(s) failed: {', '.join(failed)}" if failed else "all rules passed")
    )
    return 1 if failed else 0


async def _demo(model: str, via_server: bool, max_tokens: int) -> None:
    """Smoke job: render a tool-calling chat, sample from vLLM, show text and token ids."""
    from transformers import AutoTokenizer

    from agentrl.inference import (
        InferenceClient,
        InferenceConfig,
        SamplingConfig,
        VLLMEngineClient,
        VLLMServer,
        VLLMServerClient,
    )
    from agentrl.models import resolve_model

    started = time.perf_counter()
    path = resolve_model(model)
    print(f"model: {path}  (ready in {time.perf_counter() - started:.1f} s)", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(path)
    config = InferenceConfig(model=path)
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tools=[CALCULATOR_SCHEMA], add_generation_prompt=True,
            tokenize=True, return_dict=True,
        )["input_ids"]
        for q in DEMO_QUESTIONS
    ]  # fmt: skip
    sampling = SamplingConfig(max_tokens=max_tokens, temperature=1.0, seed=0)
    print(f"starting vLLM ({'vllm serve over HTTP' if via_server else 'in-process AsyncLLM'})...",
          flush=True)  # fmt: skip

    async def run(client: InferenceClient) -> None:
        t = time.perf_counter()
        results = await asyncio.gather(
            *(client.generate(p, sampling, f"demo-{i}") for i, p in enumerate(prompts))
        )
        elapsed = time.perf_counter() - t
        for question, result in zip(DEMO_QUESTIONS, results, strict=True):
            text = tokenizer.decode(result.token_ids)
            print(f"\nuser: {question}")
            print(f"assistant ({len(result.token_ids)} tokens, {result.finish_reason}, "
                  f"policy v{result.version}): {text!r}")  # fmt: skip
            print(f"token ids: {list(result.token_ids)}")
            mean = sum(result.logprobs) / max(len(result.logprobs), 1)
            print(f"mean behaviour logprob: {mean:.3f}")
        tokens = sum(len(r.token_ids) for r in results)
        print(f"\n{tokens} tokens in {elapsed:.2f} s through vLLM; the tiny model is untrained, "
              f"so its text is noise.")  # fmt: skip

    if via_server:
        async with await VLLMServer.start(config, log_dir=".agentrl-logs") as server:
            print(f"vllm serve pid {server.pid} at {server.url}", flush=True)
            async with VLLMServerClient(server.url, config) as client:
                await run(client)
    else:
        async with await VLLMEngineClient.start(config) as client:
            await run(client)


if __name__ == "__main__":
    sys.exit(main())

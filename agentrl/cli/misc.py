"""The smaller commands: ``demo``, ``build-model``, ``check-env``, ``top`` and ``plot``."""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

LOG_DIR = Path(".agentrl-logs")
"""Where the demo's vLLM writes what it prints (the server's output; the engine's
without ``-v``)."""
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


def _check_env(args: argparse.Namespace, extra: list[str]) -> int:
    from agentrl.check import check_env, tool_sandboxes
    from agentrl.env import import_env_modules, load_env_plugins, make_env

    env_id = args.env_id
    load_env_plugins()
    import_env_modules(args.imports, key="--import")
    results = check_env(
        env_id, raise_on_failure=False, example_actions=args.example_actions, kwargs=args.kwargs
    )
    for r in results:
        print(f"{'PASS' if r.passed else 'FAIL'}  {r.rule:<20} {'' if r.passed else r.detail}")
    built = (lambda: make_env(env_id, **args.kwargs)) if args.kwargs else env_id
    for sandbox in tool_sandboxes(built):  # which isolation its model-written code gets
        label = "tool " + sandbox.tool
        print(f"{'INFO' if sandbox.mechanism else 'WARN'}  {label:<20} {sandbox.detail}")
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
    config = InferenceConfig()
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}],
            tools=[CALCULATOR_SCHEMA],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )["input_ids"]
        for q in DEMO_QUESTIONS
    ]
    sampling = SamplingConfig(max_tokens=max_tokens, temperature=1.0, seed=0)
    print(
        f"starting vLLM ({'vllm serve over HTTP' if via_server else 'in-process AsyncLLM'})...",
        flush=True,
    )

    async def run(client: InferenceClient) -> None:
        t = time.perf_counter()
        results = await asyncio.gather(
            *(client.generate(p, sampling, f"demo-{i}") for i, p in enumerate(prompts))
        )
        elapsed = time.perf_counter() - t
        for question, result in zip(DEMO_QUESTIONS, results, strict=True):
            text = tokenizer.decode(result.token_ids)
            print(f"\nuser: {question}")
            print(
                f"assistant ({len(result.token_ids)} tokens, {result.finish_reason}, "
                f"policy v{result.version}): {text!r}"
            )
            print(f"token ids: {list(result.token_ids)}")
            mean = sum(result.logprobs) / max(len(result.logprobs), 1)
            print(f"mean behaviour logprob: {mean:.3f}")
        tokens = sum(len(r.token_ids) for r in results)
        print(
            f"\n{tokens} tokens in {elapsed:.2f} s through vLLM; the tiny model is untrained, "
            f"so its text is noise."
        )

    if via_server:
        async with await VLLMServer.start(path, config, log_dir=LOG_DIR) as server:
            print(f"vllm serve pid {server.pid} at {server.url}", flush=True)
            async with VLLMServerClient(server.url, config) as client:
                await run(client)
    else:
        async with await VLLMEngineClient.start(path, config, log_dir=LOG_DIR) as client:
            await run(client)


def _run_demo(args: argparse.Namespace, extra: list[str]) -> int:
    asyncio.run(_demo(args.model, args.server, args.max_tokens))
    return 0


def _build_model(args: argparse.Namespace, extra: list[str]) -> int:
    from agentrl.models.tiny import build_tiny_model

    print(build_tiny_model(cache_dir=args.cache_dir))
    return 0


def _top(args: argparse.Namespace, extra: list[str]) -> int:
    from pathlib import Path

    from agentrl.monitor import top

    return top(Path(args.run_dir), once=args.once)


def _plot(args: argparse.Namespace, extra: list[str]) -> int:
    from agentrl.plots import write_plots

    for path in write_plots(args.run_dir):
        print(path)
    return 0

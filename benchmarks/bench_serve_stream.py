"""The `vllm serve` client's CPU a sampled token, streaming every token or every N.

    python benchmarks/bench_serve_stream.py [--requests 64] [--tokens 256] [--rounds 6]

Starts `vllm serve` (the tiny model by default) on 127.0.0.1 and sends it the same
work both ways through :class:`~agentrl.inference.server.VLLMServerClient`: R
concurrent requests of exactly L sampled tokens (``ignore_eos``), once with the server
sending every token (``stream_interval`` 1) and once every
:data:`~agentrl.inference.base.STREAM_INTERVAL` tokens (what the client asks for).
The two alternate for ``--rounds`` rounds, the order swapped every round, after a
warm-up. Per round: tokens/s, the CPU time of this process (the client; in
`agentrl train` the process that also runs the episode loop) a sampled token, and the
CPU time of the server's processes (its API server and engine core). The table gives
the medians; on a machine with few cores the client's and the server's CPU compete.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import save, table


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of the live processes among ``pids`` (Linux ``/proc``)."""
    total = 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (name) "
        total += int(fields[11]) + int(fields[12])  # utime, stime (stat fields 14, 15)
    return total / os.sysconf("SC_CLK_TCK")


async def one_round(
    client: Any, server_pids: list[int], requests: int, tokens: int, tag: str
) -> dict[str, float]:
    from agentrl.inference.base import SamplingConfig

    prompt = list(range(100, 140))
    sampling = SamplingConfig(max_tokens=tokens, ignore_eos=True)
    server0, cpu0, t0 = _cpu_s(server_pids), time.process_time(), time.perf_counter()
    results = await asyncio.gather(
        *(client.generate(prompt, sampling, f"{tag}-{i}") for i in range(requests))
    )
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    server = _cpu_s(server_pids) - server0
    sampled = sum(len(r.token_ids) for r in results)
    if sampled != requests * tokens:
        raise RuntimeError(f"sampled {sampled} tokens, expected {requests * tokens}")
    return {
        "tokens_per_s": sampled / wall,
        "client_us_per_token": cpu / sampled * 1e6,
        "server_cpu_s": server,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from agentrl.inference import server as served
    from agentrl.inference.base import STREAM_INTERVAL, InferenceConfig
    from agentrl.models import resolve_model
    from agentrl.runtime.stopping import descendants

    config = InferenceConfig()
    intervals = (1, STREAM_INTERVAL)
    rounds: dict[int, list[dict[str, float]]] = {i: [] for i in intervals}
    with tempfile.TemporaryDirectory() as logs:
        print("starting vllm serve ...", flush=True)
        server = await served.VLLMServer.start(
            str(resolve_model(args.model)), config, log_dir=Path(logs)
        )
        try:
            pids = [server.process.pid, *descendants(server.process.pid)]
            async with served.VLLMServerClient(server.url, config) as client:
                for interval in intervals:  # warm-up, both ways
                    served.STREAM_INTERVAL = interval
                    await one_round(client, pids, 8, 16, f"warm-{interval}")
                for r in range(args.rounds):
                    for interval in intervals if r % 2 == 0 else intervals[::-1]:
                        served.STREAM_INTERVAL = interval
                        row = await one_round(
                            client, pids, args.requests, args.tokens, f"r{r}-{interval}"
                        )
                        rounds[interval].append(row)
                        print(
                            f"  round {r + 1}, every {interval}: {row['tokens_per_s']:,.0f} "
                            f"tok/s, client {row['client_us_per_token']:.1f} us a token, "
                            f"server {row['server_cpu_s']:.2f} s CPU",
                            flush=True,
                        )
        finally:
            served.STREAM_INTERVAL = STREAM_INTERVAL
            await server.stop()
    medians = {
        str(i): {k: statistics.median(row[k] for row in rows) for k in rows[0]}
        for i, rows in rounds.items()
    }
    return {
        "intervals": list(intervals),
        "medians": medians,
        "rounds": {str(i): rows for i, rows in rounds.items()},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    if min(args.requests, args.tokens, args.rounds) < 1:
        raise SystemExit("--requests, --tokens and --rounds must each be >= 1")
    print(
        f"vllm serve client: {args.requests} requests x {args.tokens} tokens, "
        f"{args.rounds} rounds each way",
        flush=True,
    )
    result = asyncio.run(main_async(args))
    every, interval = (result["medians"][str(i)] for i in result["intervals"])
    rows = [
        [
            "every token" if i == 1 else f"every {i} tokens",
            m["tokens_per_s"],
            m["client_us_per_token"],
            m["server_cpu_s"],
        ]
        for i, m in zip(result["intervals"], (every, interval), strict=True)
    ]
    md = "### `vllm serve` client: streaming every token against every N\n\n" + table(
        [
            "server sends",
            "tokens/s (median)",
            "client CPU us a token (median)",
            "server processes' CPU s a round (median)",
        ],
        rows,
    )
    md += (
        f"\n\nEvery {result['intervals'][1]} tokens against every one: tokens/s x"
        f"{interval['tokens_per_s'] / every['tokens_per_s']:.2f}, client CPU a token x"
        f"{interval['client_us_per_token'] / every['client_us_per_token']:.2f}, server CPU "
        f"x{interval['server_cpu_s'] / every['server_cpu_s']:.2f}."
    )
    print(md, flush=True)
    save("serve_stream", vars(args), result, md)
    return result


if __name__ == "__main__":
    main()

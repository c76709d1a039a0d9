"""An env server's cost per step over loopback: the same env local and remote, side by side.

    python benchmarks/bench_remote_env.py [--steps 2000]

Each env is stepped ``--steps`` times through :class:`agentrl.env.EnvHandle` (what the
rollout engine calls) two ways, interleaved step by step so a noisy machine moves both:
the env in this process, and a :class:`agentrl.remote.RemoteEnv` session on ``agentrl
serve-env`` (a subprocess on 127.0.0.1: one WebSocket round trip, the server's JSON and
env call, the ``env_state`` snapshot each answer carries). Reported: p50 and p99 per-step
latency of each and their difference, the env server's overhead per step. ``bench/Echo-v0``
costs nothing itself (async, no thread); ``agentrl/GuessNumber-v0`` is a sync env (a
worker thread per call locally). Episodes that end are reset untimed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import envs  # noqa: E402,F401  (registers the shipped envs)
from agentrl.env import EnvHandle, make_env  # noqa: E402
from agentrl.remote import EnvServerPool  # noqa: E402
from benchmarks.common import quantile, save, table  # noqa: E402

ENVS: dict[str, tuple[dict[str, Any], str]] = {
    "bench/Echo-v0": ({"turns": 10**9}, "hello"),
    "agentrl/GuessNumber-v0": ({}, "Guess: 0"),  # never right: "Higher." every step
}
"""Env id: (kwargs, the action every step sends)."""
WARMUP_STEPS = 50


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def env_server(env_id: str, kwargs: dict[str, Any]) -> Iterator[str]:
    """``agentrl serve-env`` for ``env_id`` on a free loopback port; its URL."""
    port = free_port()
    agentrl = str(Path(sys.executable).parent / "agentrl")
    args = [
        agentrl,
        "serve-env",
        env_id,
        "--port",
        str(port),
        "--import",
        "benchmarks.common",
        "--kwargs",
        json.dumps(kwargs),
    ]
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path[1:]])}
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(args, cwd=ROOT, env=environ, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"agentrl serve-env {env_id} exited: {log.read()!r}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{url}/health", timeout=1):
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"agentrl serve-env {env_id} did not answer in 60 s")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


async def timed_step(handle: EnvHandle, action: str) -> float:
    """Seconds of one step (an episode that ended is reset first, untimed)."""
    started = time.perf_counter()
    _, _, terminated, truncated, _ = await handle.step(action)
    took = time.perf_counter() - started
    if terminated or truncated:
        await handle.reset(seed=0)
    return took


async def measure(env_id: str, url: str, steps: int) -> dict[str, list[float]]:
    kwargs, action = ENVS[env_id]
    local = EnvHandle(make_env(env_id, **kwargs))
    async with EnvServerPool([url], env_id) as pool:
        remote = EnvHandle(pool.make(env_id))
        times: dict[str, list[float]] = {"local": [], "remote": []}
        try:
            for handle in (local, remote):
                await handle.open()
                await handle.reset(seed=0)
                for _ in range(WARMUP_STEPS):
                    await timed_step(handle, action)
            for _ in range(steps):
                times["local"].append(await timed_step(local, action))
                times["remote"].append(await timed_step(remote, action))
        finally:
            for handle in (local, remote):
                await handle.close()
                handle.abandon()
    return times


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="timed steps per env and way")
    args = parser.parse_args(argv)
    print(
        f"remote env cost: {list(ENVS)} ({args.steps} steps each, local and remote interleaved)",
        flush=True,
    )
    results: dict[str, dict[str, float]] = {}
    rows = []
    for env_id, (kwargs, _) in ENVS.items():
        with env_server(env_id, kwargs) as url:
            times = asyncio.run(measure(env_id, url, args.steps))
        figures = {
            f"{way}_{name}_us": 1e6 * fn(times[way])
            for way in ("local", "remote")
            for name, fn in (("p50", statistics.median), ("p99", lambda v: quantile(v, 0.99)))
        }
        results[env_id] = figures
        p50 = figures["remote_p50_us"] - figures["local_p50_us"]
        p99 = figures["remote_p99_us"] - figures["local_p99_us"]
        rows.append(
            [
                f"`{env_id}`",
                figures["local_p50_us"],
                figures["local_p99_us"],
                figures["remote_p50_us"],
                figures["remote_p99_us"],
                p50,
                p99,
            ]
        )
        print(
            f"  {env_id}: local p50 {figures['local_p50_us']:.1f} us, remote p50 "
            f"{figures['remote_p50_us']:.1f} us (+{p50:.1f} us)",
            flush=True,
        )
    md = "### Remote env cost per step (`agentrl serve-env` + RemoteEnv over loopback)\n\n" + table(
        [
            "env",
            "local p50 (µs)",
            "local p99 (µs)",
            "remote p50 (µs)",
            "remote p99 (µs)",
            "overhead p50 (µs)",
            "overhead p99 (µs)",
        ],
        rows,
    )
    md += (
        f"\n\n{args.steps} steps per env and way through EnvHandle, local and remote "
        "interleaved step by step; the server is a separate process on the same machine."
    )
    print(md, flush=True)
    save("remote_env", vars(args), results, md)
    return results


if __name__ == "__main__":
    main()

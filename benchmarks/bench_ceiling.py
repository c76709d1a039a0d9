"""The rollout loop's own ceiling: turns/s with an engine that answers instantly.

    python benchmarks/bench_ceiling.py [--cases 1024x3x32,256x3x256] [--rounds 3]
                                       [--workers 2] [--compare REV] [--no-profile]

No model runs: :class:`InstantClient` implements the
:class:`~agentrl.inference.base.InferenceClient` protocol and answers every request at
once with exactly ``max_tokens`` tokens (the last one the end-of-turn token). The rest
is the project's own: ``Scheduler`` + ``EpisodeRunner`` (chat template, tokenization,
token provenance, a checkpoint per turn) against the zero-cost ``bench/Echo-v0`` env,
all episodes of a case at once, with the ``StoreWriter`` (real SQLite in a temporary
directory) and without it. So the figures are the most turns per second agentrl can
feed from one event loop: a GPU fleet faster than this waits on agentrl.

A case ``ExTxL`` is E episodes of T turns of L sampled tokens. Each case runs without the
store, with it, and with it through ``--workers`` rollout worker processes
(:mod:`agentrl.rollout.workers`: the episodes on N event loops, the engine, scheduler
and store in this one). Each run sends the case's episodes through its runner and store
twice: a first wave (other seeds), then the measured wave. The ceiling is a sustained
rate; what a run pays once (worker processes starting the env threads of hundreds of
concurrent env builds, their first renderings) falls in the first wave, whose turns/s is
reported apart. Reported per case, for the measured wave: turns/s, sampled tokens/s, CPU
per turn (every thread of this process, plus the workers' CPU read from ``/proc``, over
the turns), this process's part of it, and the event-loop lag p99 of this process and of
the workers (:class:`~agentrl.runtime.metrics.LoopLagMonitor`), the median of ``--rounds``
rounds. Then one more run with the store (one wave), under cProfile (every thread,
CPU time), splits the CPU per turn into stages by which function the time was spent
under (:data:`STAGES`; what is left is runner bookkeeping: the runner, scheduler,
asyncio, the env). The profile's shares are applied to the unprofiled CPU per turn, so
the stages add up to it.

``--compare REV`` measures the tree at git revision REV (a temporary ``git worktree``)
side by side with this one: each round runs both, one after the other, each in its own
process importing its own ``agentrl`` (this file's measuring code is the same for both).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # appended: under --compare, PYTHONPATH picks the agentrl
    sys.path.append(str(ROOT))

# (stage, roots): a root is (path suffix, function name, caller name or "", the stage it
# runs inside or ""). A stage's time is the cumulative CPU time under its roots (under
# the named caller only, when one is named); a root inside another stage's root is taken
# out of that one. Names from older revisions stay, so --compare splits both alike.
STAGES: list[tuple[str, list[tuple[str, str, str, str]]]] = [
    (
        "render",
        [
            ("agentrl/chat/conversation.py", "render", "", ""),
            ("agentrl/chat/rendering.py", "text", "delta_for", ""),
        ],
    ),
    (
        "tokenize",
        [
            ("tokenization_utils_base.py", "__call__", "apply_chat_template", "render"),
            ("agentrl/chat/conversation.py", "decode", "", ""),
            ("agentrl/chat/rendering.py", "ids", "_piece_delta", ""),
            ("agentrl/chat/rendering.py", "encode", "delta_for", ""),
        ],
    ),
    ("checkpoint", [("agentrl/rollout/runner.py", "_checkpoint", "", "")]),
    ("store write", [("agentrl/store/writer.py", "_apply", "", "")]),
    (
        "validation",
        [
            ("agentrl/types.py", "validate", "", ""),
            ("agentrl/types/trajectory.py", "validate", "", ""),
            ("agentrl/inference/base.py", "__post_init__", "", ""),
        ],
    ),
]


class InstantClient:
    """An :class:`~agentrl.inference.base.InferenceClient` with no model behind it.

    Every ``generate`` returns ``max_tokens`` tokens at once (``token`` repeated, then
    ``end_of_turn``), logprob -0.5 each, finish ``stop``. Weight loads only bump the
    version (there are no weights); ``push_weights`` refuses (no transfer backend).
    """

    def __init__(self, token: int, end_of_turn: int, max_model_len: int = 8192) -> None:
        from agentrl.inference.base import InflightRequests

        self.token = token
        self.end_of_turn = end_of_turn
        self._max_model_len = max_model_len
        self._version = 0
        self._requests = InflightRequests()

    @property
    def version(self) -> int:
        return self._version

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def requests(self) -> Any:
        return self._requests

    async def generate(self, prompt_token_ids: Sequence[int], sampling: Any, request_id: str):
        from agentrl.inference.base import Generation, clamp_max_tokens

        n = clamp_max_tokens(len(prompt_token_ids), sampling, self._max_model_len)
        await asyncio.sleep(0)  # the reply arrives through the loop, as from an engine
        ids = (self.token,) * (n - 1) + (self.end_of_turn,)
        return Generation(
            request_id, ids, (-0.5,) * n, "stop", self._version, len(prompt_token_ids)
        )

    async def abort(self, request_id: str) -> None:
        return None  # nothing is ever in flight

    async def reload_weights(
        self, weights_dir: str, version: int | None = None, *, keep_inflight: bool = False
    ) -> int:
        self._version = self._version + 1 if version is None else version
        return self._version

    async def load_lora_adapter(
        self, adapter_dir: str, version: int | None = None, *, keep_inflight: bool = False
    ) -> int:
        return await self.reload_weights(adapter_dir, version)

    async def push_weights(
        self, send: Any, version: int | None = None, *, keep_inflight: bool = False
    ) -> int:
        from agentrl.errors import WeightSyncError

        raise WeightSyncError("the instant client has no weight-transfer backend")

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> InstantClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def parse_case(text: str) -> tuple[int, int, int]:
    try:
        e, t, n = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"case {text!r} is not EPISODESxTURNSxTOKENS (e.g. 1024x3x32)") from None
    if min(e, t, n) < 1 or n < 2:
        raise SystemExit(f"case {text!r}: every count must be >= 1 and tokens >= 2")
    return e, t, n


# -- one run (in a worker process) -------------------------------------------------------


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far, from ``/proc``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _start_runner(
    stack: contextlib.AsyncExitStack,
    client: Any,
    tokenizer: Any,
    rollout: Any,
    metrics: Any,
    checkpoint: Any,
    workers: int,
) -> tuple[Any, tuple[int, ...]] | None:
    """The runner of a case and its worker processes' pids: ``workers`` rollout worker
    processes when more than one (None on a tree without them), else one EpisodeRunner."""
    import dataclasses

    from agentrl.rollout import EpisodeRunner

    if workers <= 1:
        runner = EpisodeRunner(client, tokenizer, rollout, metrics=metrics, checkpoint=checkpoint)
        return runner, ()
    try:
        from agentrl.rollout.workers import WorkerRunner
    except ImportError:  # an older tree (--compare)
        return None
    rollout = dataclasses.replace(rollout, workers=workers)
    runner = await stack.enter_async_context(
        WorkerRunner(
            client,
            tokenizer,
            rollout,
            metrics=metrics,
            checkpoint=checkpoint,
            imports=["benchmarks.common"],
        )
    )
    pids = getattr(runner, "pids", None)
    if pids is None:  # an older tree
        pids = tuple(w.process.pid for w in runner._workers)
    return runner, pids


def _check_counts(queue: Any, db: Any, case: tuple[int, int, int], warmup: bool) -> int:
    """The tokens sampled in the measured wave, checked against the case; the store (if
    any) closed after checking it holds every wave's trajectories."""
    episodes, turns, tokens = case
    trajectories = [t for g in queue._groups for t in g.trajectories]
    sampled = sum(int(t.loss_mask.sum()) for t in trajectories)
    if sampled != episodes * turns * tokens:
        raise RuntimeError(f"sampled {sampled} tokens, expected {episodes * turns * tokens}")
    if db is not None:
        stored = sum(1 for _ in db.all_trajectories())
        db.close()
        expected = episodes * (2 if warmup else 1)
        if stored != expected:
            raise RuntimeError(f"the store holds {stored} trajectories, expected {expected}")
    return sampled


async def one_run(
    tokenizer: Any,
    case: tuple[int, int, int],
    store: bool,
    tmp: Path,
    workers: int = 1,
    warmup: bool = True,
) -> dict[str, Any] | None:
    """One case; with ``workers`` > 1 through that many rollout worker processes (None on
    a tree without them).

    With ``warmup``, the case's episodes run twice through the same runner and store: a
    first wave (other seeds, so no rendering is remembered from it), then the measured
    one. The ceiling is a sustained rate; the first wave pays what a run pays once (worker
    processes building their env threads and their first renderings), and its turns/s is
    reported apart.
    """

    from agentrl.queue import TrajectoryQueue
    from agentrl.rollout import RolloutConfig, Scheduler, tasks_for
    from agentrl.runtime.metrics import LoopLagMonitor, Metrics
    from agentrl.store import EpisodeStore, StoreWriter

    episodes, turns, tokens = case
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    client = InstantClient(tokenizer.encode(" hello")[0], eot)
    rollout = RolloutConfig(max_turns=turns, max_tokens_per_turn=tokens, ignore_eos=True)
    metrics = Metrics()
    db = EpisodeStore.open(tmp) if store else None
    first_wave: float | None = None
    async with contextlib.AsyncExitStack() as stack:
        writer = await stack.enter_async_context(StoreWriter(db)) if db is not None else None
        checkpoint = writer.partial if writer else None
        started = await _start_runner(
            stack, client, tokenizer, rollout, metrics, checkpoint, workers
        )
        if started is None:  # an older tree (--compare) without rollout workers
            return None
        runner, pids = started

        async def wave(first_seed: int) -> TrajectoryQueue:
            queue = TrajectoryQueue(episodes + 1)
            limits = RolloutConfig(concurrency=episodes, group_size=1)
            scheduler = Scheduler(runner, queue, limits, writer=writer)
            tasks = tasks_for("bench/Echo-v0", episodes, first_seed=first_seed, turns=turns)
            await scheduler.run(list(tasks))
            if writer is not None:
                await writer.flush()
            return queue

        if warmup:
            t0 = time.perf_counter()
            await wave(first_seed=episodes)
            first_wave = episodes * turns / (time.perf_counter() - t0)
            for name in ("loop_lag_s", "worker_loop_lag_s"):  # the measured wave's only
                metrics.samples[name].clear()
        workers_cpu0 = sum(process_cpu_s(p) for p in pids)
        cpu0, t0 = time.process_time(), time.perf_counter()
        async with LoopLagMonitor(metrics):
            queue = await wave(first_seed=0)
        wall, main_cpu = time.perf_counter() - t0, time.process_time() - cpu0
        workers_cpu = sum(process_cpu_s(p) for p in pids) - workers_cpu0
    cpu = main_cpu + workers_cpu
    sampled = _check_counts(queue, db, case, warmup)
    n_turns = episodes * turns
    return {
        "turns_per_s": n_turns / wall,
        "tokens_per_s": sampled / wall,
        "wall_s": wall,
        "cpu_us_per_turn": cpu / n_turns * 1e6,
        "main_cpu_us_per_turn": main_cpu / n_turns * 1e6,
        "first_wave_turns_per_s": first_wave,
        "loop_lag_p99_ms": metrics.percentile("loop_lag_s", 99) * 1000,
        "worker_loop_lag_p99_ms": metrics.percentile("worker_loop_lag_s", 99) * 1000
        if workers > 1
        else None,
    }


@contextlib.contextmanager
def profiled() -> Iterator[list[Any]]:
    """cProfile every thread (CPU time), this one and those started meanwhile.

    Threads started before cannot be profiled (Python 3.11), so the loop gets a fresh
    default executor (the store writer's thread) and the env threads kept for reuse are
    let go (new ones start) for the profiled run.
    """
    import concurrent.futures
    import cProfile
    import threading

    import agentrl.env

    env_threads = getattr(agentrl.env, "ENV_THREADS", None)  # older trees keep none
    if env_threads is not None:
        env_threads.drain()
    asyncio.get_running_loop().set_default_executor(concurrent.futures.ThreadPoolExecutor())
    profiles: list[Any] = []

    def start(*_: Any) -> None:  # runs once in each new thread, then hands over
        p = cProfile.Profile(time.thread_time)
        profiles.append(p)
        p.enable()

    main = cProfile.Profile(time.thread_time)
    profiles.append(main)
    threading.setprofile(start)
    main.enable()
    try:
        yield profiles
    finally:
        main.disable()
        threading.setprofile(None)  # type: ignore[arg-type]


IDLE_WAITS = frozenset(
    {
        "<method 'get' of '_queue.SimpleQueue' objects>",
        "<method 'acquire' of '_thread.lock' objects>",
        "<method 'acquire' of '_thread.RLock' objects>",
    }
)
"""Blocking waits of idle worker threads (see :func:`stage_shares`)."""


def stage_shares(profiles: list[Any]) -> dict[str, float]:
    """Each stage's share of the profiled CPU time (see :data:`STAGES`)."""
    import pstats

    stats = pstats.Stats(profiles[0])
    for p in profiles[1:]:
        with contextlib.suppress(TypeError):  # a thread that never ran profiled code
            stats.add(p)
    table = stats.stats  # type: ignore[attr-defined]
    # A thread still waiting for work when the stats are taken (env threads kept for the
    # next env, render threads) has its open call closed by the taker's clock: its wait
    # shows the *main* thread's CPU time. Waits cost no CPU, so they are left out.
    total = sum(v[2] for k, v in table.items() if k[2] not in IDLE_WAITS) or 1e-12
    shares = {stage: 0.0 for stage, _ in STAGES}
    for stage, roots in STAGES:
        for (path, _line, name), (_cc, _nc, _tt, ct, callers) in table.items():
            for suffix, func, caller, inside in roots:
                if name != func or not path.endswith(suffix):
                    continue
                t = sum(v[3] for k, v in callers.items() if k[2] == caller) if caller else ct
                shares[stage] += t / total
                if inside:
                    shares[inside] -= t / total
    shares["runner bookkeeping"] = max(0.0, 1.0 - sum(shares.values()))
    return shares


async def worker(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    import benchmarks.common  # noqa: F401  (registers bench/Echo-v0)
    from agentrl.models import resolve_model
    from agentrl.runtime.metrics import tune_gc

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.model))
    tune_gc()
    out: dict[str, Any] = {"runs": {}, "stages": {}}
    with tempfile.TemporaryDirectory() as tmp:
        await one_run(tokenizer, (8, 2, 4), True, Path(tmp) / "warm", warmup=False)
        for i, text in enumerate(args.cases):
            case = parse_case(text)
            for store in (False, True):
                row = await one_run(tokenizer, case, store, Path(tmp) / f"{i}-{store}")
                out["runs"][f"{text}/{'store' if store else 'no store'}"] = row
            for n in args.workers:
                row = await one_run(tokenizer, case, True, Path(tmp) / f"{i}-w{n}", n)
                if row is not None:
                    out["runs"][f"{text}/store, {n} workers"] = row
            if args.profile:
                with profiled() as profiles:
                    await one_run(tokenizer, case, True, Path(tmp) / f"{i}-profiled", warmup=False)
                out["stages"][text] = stage_shares(profiles)
    return out


# -- the driver --------------------------------------------------------------------------


def run_worker(tree: Path, args: argparse.Namespace, profile: bool) -> dict[str, Any]:
    """One round in a fresh process importing ``agentrl`` from ``tree``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(ROOT)])}
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--model",
        args.model,
        "--cases",
        ",".join(args.cases),
        "--workers",
        ",".join(map(str, args.workers)),
    ] + ([] if profile else ["--no-profile"])
    # cwd: the tree, so that an older tree's rollout workers (started with -m) import it too
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tree, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"the bench worker for {tree} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def worktree(rev: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="agentrl-ceiling-") as tmp:
        path = Path(tmp) / "tree"
        git = ["git", "-C", str(ROOT)]
        subprocess.run(
            [*git, "worktree", "add", "--detach", str(path), rev],
            check=True,
            capture_output=True,
            text=True,
        )
        try:
            yield path
        finally:
            subprocess.run(
                [*git, "worktree", "remove", "--force", str(path)], capture_output=True, text=True
            )


def measure(args: argparse.Namespace, trees: dict[str, Path]) -> dict[str, Any]:
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for r in range(args.rounds):
        for name, tree in trees.items():
            result = run_worker(tree, args, profile=args.profile and r == 0)
            rounds[name].append(result)
            for key, row in result["runs"].items():
                print(
                    f"  round {r + 1} {name}: {key}: {row['turns_per_s']:,.0f} turns/s, "
                    f"{row['cpu_us_per_turn']:,.0f} us CPU/turn, loop lag p99 "
                    f"{row['loop_lag_p99_ms']:.1f} ms",
                    flush=True,
                )
    out: dict[str, Any] = {}
    for name, results in rounds.items():
        medians = {}
        for key in results[0]["runs"]:
            rows = [res["runs"][key] for res in results]
            medians[key] = {}
            for m in rows[0]:
                values = [row[m] for row in rows if row.get(m) is not None]
                medians[key][m] = statistics.median(values) if values else None
        out[name] = {"runs": medians, "stages": results[0]["stages"]}
    return out


def markdown(result: dict[str, Any], args: argparse.Namespace) -> str:
    from benchmarks.common import table

    names = list(result)
    md = (
        "### Rollout loop ceiling (instant engine, `bench/Echo-v0`; one event loop, and "
        "through rollout worker processes)\n\n"
    )
    rows = []
    keys = list(dict.fromkeys(k for name in names for k in result[name]["runs"]))
    for key in keys:
        for name in names:
            r = result[name]["runs"].get(key)
            if r is None:
                continue
            main = r.get("main_cpu_us_per_turn", r["cpu_us_per_turn"])
            worker_lag = r.get("worker_loop_lag_p99_ms")
            first = r.get("first_wave_turns_per_s")
            rows.append(
                [
                    name,
                    *key.split("/"),
                    r["turns_per_s"],
                    r["tokens_per_s"],
                    r["cpu_us_per_turn"],
                    main,
                    r["loop_lag_p99_ms"],
                    "" if worker_lag is None else worker_lag,
                    "" if first is None else first,
                ]
            )
    md += table(
        [
            "tree",
            "episodes x turns x tokens",
            "store",
            "turns/s",
            "tokens/s",
            "CPU us/turn (all processes)",
            "main process CPU us/turn",
            "main loop lag p99 (ms)",
            "workers' loop lag p99 (ms)",
            "first wave turns/s",
        ],
        rows,
    )
    stage_names = [s for s, _ in STAGES] + ["runner bookkeeping"]
    rows = []
    for case in args.cases:
        for name in names:
            shares = result[name]["stages"].get(case)
            if not shares:
                continue
            cpu = result[name]["runs"][f"{case}/store"]["cpu_us_per_turn"]
            rows.append([name, case, *(shares[s] * cpu for s in stage_names)])
    if rows:
        md += (
            "\n\nCPU us per turn by stage, with the store (cProfile of one run, every "
            "thread; its shares applied to the unprofiled CPU per turn):\n\n"
        )
        md += table(["tree", "case", *stage_names], rows)
    md += f"\n\nMedian of {args.rounds} round(s); load average at the end: {_load()}."
    return md


def _load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="whose tokenizer and chat template")
    parser.add_argument(
        "--cases", default="1024x3x32,256x3x256", help="EPISODESxTURNSxTOKENS, comma-separated"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--workers",
        default="2",
        help="also run each case with the store through this many rollout "
        "worker processes (comma-separated; '' for none)",
    )
    parser.add_argument("--compare", metavar="REV", help="also measure git revision REV")
    parser.add_argument("--no-profile", dest="profile", action="store_false")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.cases = [c.strip() for c in str(args.cases).split(",") if c.strip()]
    try:
        args.workers = [int(w) for w in str(args.workers).split(",") if w.strip()]
    except ValueError:
        raise SystemExit(f"--workers {args.workers!r}: give counts, e.g. 2 or 2,4") from None
    if any(w < 2 for w in args.workers):
        raise SystemExit(f"--workers {args.workers}: each count must be >= 2 (1 is the plain run)")
    for case in args.cases:
        parse_case(case)
    if args.worker:
        print(json.dumps(asyncio.run(worker(args))))
        return {}
    if args.rounds < 1:
        raise SystemExit(f"--rounds {args.rounds}: it must be >= 1")
    print(
        f"rollout loop ceiling: cases {args.cases}, {args.rounds} round(s)"
        + (f", against {args.compare}" if args.compare else ""),
        flush=True,
    )
    with contextlib.ExitStack() as stack:
        trees = {}
        if args.compare:
            trees[args.compare] = stack.enter_context(worktree(args.compare))
        trees["this tree"] = ROOT
        result = measure(args, trees)
    md = markdown(result, args)
    print(md, flush=True)
    from benchmarks.common import save

    settings = {k: v for k, v in vars(args).items() if k != "worker"}
    save("ceiling", settings, result, md, markdown_file=True)
    return result


if __name__ == "__main__":
    main()

"""`agentrl replay` on every kind of run directory, for shipped and user envs.

{rollout run, train run} x {a shipped env, an env registered only by a user module
passed with --import / env.imports} x {show, --verify, --fork-at, --resume, --export},
through the real CLI and real vLLM. The train run of the shipped env configures it with
``[env] kwargs`` (as the guess-number example does): verify, fork and resume must rebuild
it with them, and the rollout's replay check must not flag its episodes. Each run is
SIGKILLed part-way, once its store holds an ended episode and a durable checkpoint of an
unfinished one, so that it holds unfinished episodes to --resume, as a crashed run does.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.store import EpisodeStore
from tests.faults.harness import AGENTRL, Proc

LEDGER = str(Path(__file__).with_name("ledger_env.py"))
ENVS = {"shipped": "agentrl/GuessNumber-v0", "user": "user/Ledger-v0"}
KWARGS = {"shipped": "{low = 1, high = 30, max_guesses = 8}", "user": "{}"}

TRAIN = """
[run]
name = "matrix"
[env]
id = "{env_id}"
imports = {imports}
kwargs = {kwargs}
[rollout]
group_size = 2
concurrency = 8
max_turns = 4
max_tokens_per_turn = 16
[trainer]
lr = 1e-3
[train]
steps = 8
groups_per_step = 1
checkpoint_every = 1
[log]
progress = "plain"
plots = false
tensorboard = false
"""


@dataclasses.dataclass(frozen=True)
class Run:
    kind: str
    env: str
    out: Path
    environ: dict[str, str]


@pytest.fixture(
    scope="module",
    params=[(k, e) for k in ("rollout", "train") for e in ENVS],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, model_cache: Path
) -> Run:
    kind, env = request.param
    tmp = tmp_path_factory.mktemp(f"{kind}-{env}")
    out = tmp / "run"
    environ = {**os.environ, "AGENTRL_CACHE": str(model_cache)}
    imports = [LEDGER] if env == "user" else []
    if kind == "rollout":
        # Far more episodes than it runs before the kill: 24 took 3 s in fresh-clone CI,
        # over before a look at the store (every 0.1 s) saw both kinds, and 400 took 13 s
        # in another, with no look seeing both. 4,000 take minutes; the kill comes at the
        # first look that sees both (seconds into the rollout).
        args = [
            AGENTRL,
            "rollout",
            ENVS[env],
            "--episodes",
            "4000",
            "--group-size",
            "2",
            "--concurrency",
            "8",
            "--max-turns",
            "4",
            "--max-tokens",
            "16",
            "--out",
            str(out),
            *(a for i in imports for a in ("--import", i)),
        ]
    else:
        config = tmp / "train.toml"
        config.write_text(
            TRAIN.format(env_id=ENVS[env], imports=json.dumps(imports), kwargs=KWARGS[env])
        )
        args = [AGENTRL, "train", str(config), f'--run.out="{out}"']
    proc = Proc(args, tmp / "log.txt", env=environ)
    _kill_once_ended_and_unfinished(proc, out)
    rc = proc.wait(600)
    log = (tmp / "log.txt").read_text()
    assert rc == -9, f"expected the SIGKILL, got {rc}: {log[-2000:]}"
    return Run(kind, env, out, environ)


def _both(out: Path, looks: list[str] | None = None) -> bool:
    """The store holds an ended episode of two or more turns and a durable checkpoint
    of an unfinished one. What it saw (and how long the look took) is appended to
    ``looks``, for the message of a run that never held both."""
    started = time.monotonic()
    if not (out / "episodes.db").exists():
        seen = "no store yet"
    else:
        try:
            with EpisodeStore.open(out, create=False) as store:
                ended = sum(len(t.turn_starts) >= 2 for t in store.all_trajectories())
                partials = len(store.partials())
            seen = f"{ended} ended of 2+ turns, {partials} unfinished"
        except Exception as e:  # the schema may not be written yet
            seen, ended, partials = f"{type(e).__name__}: {e}", 0, 0
        if ended and partials:
            return _seen(looks, seen, started, True)
    return _seen(looks, seen, started, False)


def _seen(looks: list[str] | None, seen: str, started: float, both: bool) -> bool:
    if looks is not None:
        looks.append(f"{seen} ({time.monotonic() - started:.2f} s)")
    return both


def _kill_once_ended_and_unfinished(proc: Proc, out: Path) -> None:
    """SIGKILL the run as soon as its store holds both kinds. A fixed fault point raced
    the episodes: in fresh-clone CI the 40th generation of a rollout, and the third
    optimizer step of a train run (whose checkpoints of update 2 had all been resumed
    and ended by then), each found 8 ended episodes and no durable checkpoint.

    The run is stopped (SIGSTOP) and looked at again before the kill: between a look
    and the kill, the last unfinished episode could end and its checkpoint go (a
    fresh-clone CI run found 4 ended episodes and no checkpoint). Stopped, it writes
    nothing more, so what the second look saw is what the store keeps."""
    deadline = time.monotonic() + 600
    looks: list[str] = []
    while True:
        said = f"{len(looks)} looks, the last: {looks[-8:]}"
        ended = proc.poll() is not None
        assert not ended, f"the run ended before it held both kinds ({said}): {proc.tail()}"
        assert time.monotonic() < deadline, f"no ended and unfinished episodes in 600 s ({said})"
        if _both(out, looks):
            os.kill(proc.pid, signal.SIGSTOP)
            if _both(out, looks):
                os.kill(proc.pid, signal.SIGKILL)
                return
            os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.1)


def replay(run: Run, *args: str) -> subprocess.CompletedProcess[str]:
    # A user env is found through the run's recorded env.imports (train) or --import.
    extra = ["--import", LEDGER] if run.env == "user" and run.kind == "rollout" else []
    return subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "replay", str(run.out), *args, *extra],
        capture_output=True,
        text=True,
        timeout=600,
        env=run.environ,
    )


def episodes(run: Run) -> tuple[str, str]:
    """(an ended episode with at least two assistant turns, an unfinished one)."""
    with EpisodeStore.open(run.out, create=False) as store:
        ended = [t for t in store.all_trajectories() if len(t.turn_starts) >= 2]
        partials = store.partials()
    assert ended and partials, (len(ended), len(partials))
    return ended[0].episode_id, max(partials, key=lambda p: p.turn).episode_id


def expected_policy(run: Run, episode: str) -> str:
    """What a fork of ``episode`` of a train run must say samples it: the kept checkpoint
    of the newest version that sampled the episode, else the final model, else the base
    model. Checkpoints are pruned to the newest two, so which one applies depends on how
    far the run got before the kill (a fresh-clone CI run reached version 8)."""
    with EpisodeStore.open(run.out, create=False) as store:
        segments = [t for t in store.all_trajectories() if t.episode_id == episode]
    version = max(int(t.versions.max()) for t in segments)
    kept = {}
    for meta in (run.out / "checkpoints").glob("step-*/trainer.json"):
        kept[json.loads(meta.read_text())["version"]] = meta.parent.name
    if version in kept:
        return f"checkpoint {kept[version]} (version {version}, the policy that sampled"
    if (run.out / "model").is_dir():
        return f"no checkpoint of version {version}, which sampled this episode, was kept"
    return "the run's base model"


@pytest.mark.vllm
@pytest.mark.timeout(1800)
def test_show_verify_fork_resume_export(run: Run, tmp_path: Path) -> None:
    ended, unfinished = episodes(run)

    listed = replay(run)
    assert listed.returncode == 0, listed.stderr
    assert "(unfinished)" in listed.stdout and "--resume" in listed.stdout  # said, not hidden

    shown = replay(run, ended)
    assert shown.returncode == 0, shown.stderr
    assert "[turn 1] assistant" in shown.stdout and "⟨v" in shown.stdout

    for episode in (ended, unfinished):
        verified = replay(run, episode, "--verify")
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert "matches" in verified.stdout

    forked = replay(run, ended, "--fork-at", "1", "--temperature", "0")
    assert forked.returncode == 0, forked.stderr[-3000:]
    assert "policy: " in forked.stdout and "stored as" in forked.stdout
    if run.kind == "train":
        assert expected_policy(run, ended) in forked.stdout, forked.stdout[-3000:]

    resumed = replay(run, unfinished, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "stored as" in resumed.stdout

    # The new episodes ran on the env as the run configured it (its kwargs): they replay.
    for done in (forked, resumed):
        new_id = done.stdout.rsplit("stored as ", 1)[1].split()[0]
        again = replay(run, new_id, "--verify")
        assert again.returncode == 0 and "matches" in again.stdout, again.stdout + again.stderr
    with EpisodeStore.open(run.out, create=False) as store:
        flagged = [t.episode_id for t in store.all_trajectories() if "not_replayable" in t.info]
        if run.kind == "train" and run.env == "shipped":
            assert {t.env_kwargs["high"] for t in store.tasks()} == {30}
    assert not flagged, f"the rollout's replay check flagged {flagged}"

    out = tmp_path / "one.jsonl"
    exported = replay(run, ended, "--export", str(out))
    assert exported.returncode == 0, exported.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and rows[0]["episode_id"] == ended and rows[0]["env_log"]

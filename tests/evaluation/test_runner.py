"""`agentrl eval` on the tiny model through real vLLM: SIGKILLed mid-way, resumed, scored.

The resumed eval must run no finished episode again (same rows, no new attempt, the
store audit clean), end with every task × sample once, and write results.json with
pass@k and avg@k that agree with the episodes in the store.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from agentrl.evaluation import pass_at_k
from agentrl.store import EpisodeStore
from tests.faults.harness import AGENTRL, Proc, agentrl_env, audit

TASKS, K = 8, 4
KILL_AT = TASKS * K  # the generation call the first run is killed at
ENDED = "('finished', 'truncated', 'failed')"


def ended_rows(db: Path) -> set[tuple[str, int, float]]:
    if not db.exists():
        return set()
    conn = sqlite3.connect(db, timeout=5)
    try:
        rows = conn.execute(
            f"SELECT episode_id, attempt, updated_at FROM episodes WHERE state IN {ENDED}"
        ).fetchall()
    except sqlite3.OperationalError:  # not created yet
        return set()
    finally:
        conn.close()
    return {(e, a, u) for e, a, u in rows}


@pytest.mark.vllm
@pytest.mark.timeout(300)
def test_eval_killed_mid_way_resumes_without_rerunning_an_episode(
    tmp_path: Path, model_cache: Path
) -> None:
    # SIGKILL at the KILL_AT-th generation call, not at a moment a poll catches: a poll
    # raced the eval and lost once the rollout got faster (the eval had ended by the
    # time it looked). Every episode needs at least one generation, so at that call at
    # most KILL_AT - 1 of the TASKS * K episodes can have ended; with 4 in flight of at
    # most 3 turns each, at least (KILL_AT - 12) / 3 have, the first of them about five
    # batched generation rounds (~0.2 s each here) before the kill, well past the store
    # writer's 0.2 s commit interval.
    out = tmp_path / "eval"
    kill_env = agentrl_env(model_cache, AGENTRL_FAULTS=f"generation@{KILL_AT}")
    first = [
        AGENTRL,
        "eval",
        "tiny",
        "--env",
        "agentrl/GuessNumber-v0",
        "--episodes",
        str(TASKS),
        "-k",
        str(K),
        "--concurrency",
        "4",
        "--max-tokens",
        "32",
        "--max-turns",
        "3",
        "--out",
        str(out),
    ]
    proc = Proc(first, tmp_path / "first.log", kill_env)
    assert proc.wait(200) == -9, f"the eval was not killed at its fault point:\n{proc.tail()}"
    assert f"SIGKILL at generation (hit {KILL_AT})" in proc.text(), proc.tail()
    db = out / "episodes.db"
    before = ended_rows(db)
    assert 0 < len(before) < TASKS * K, (
        f"{len(before)} episodes ended before the kill; the test needs some, not all"
    )
    env = agentrl_env(model_cache)

    resumed = Proc([AGENTRL, "eval", "--resume", "--out", str(out)], tmp_path / "resume.log", env)
    assert resumed.wait(200) == 0, resumed.tail()
    text = resumed.text()
    assert f"({TASKS * K} episodes)" in text and "pass@4" in text and "avg@4" in text, text

    after = ended_rows(db)
    assert before <= after, "a finished episode's row changed on resume"
    finished_ids = {e for e, _, _ in before}
    assert not {(e, a) for e, a, _ in after - before if e in finished_ids}, "re-run episode"
    report = audit(out)
    assert report["integrity"] == "ok" and report["ok"], report
    assert report["tasks_by_state"] == {"complete": TASKS}, report

    with EpisodeStore.open(out, create=False) as store:
        assert [r["kind"] for r in store.runs()] == ["eval", "eval"]
        finals = {t.episode_id: t for t in store.all_trajectories()}
    assert len(finals) == TASKS * K
    assert {t.seed for t in finals.values()} == set(range(1_000_000, 1_000_000 + TASKS))

    results = json.loads((out / "results.json").read_text())
    assert (results["tasks"], results["episodes"], results["k"]) == (TASKS, TASKS * K, K)
    for row in results["per_task"]:
        assert row["samples"] == K
        for j in (1, 2, 4):
            assert row["pass_at"][f"pass@{j}"] == pytest.approx(pass_at_k(K, row["successes"], j))
    expected = sum(r["successes"] / K for r in results["per_task"]) / TASKS
    assert results["avg@4"] == pytest.approx(expected) == pytest.approx(results["pass@1"])

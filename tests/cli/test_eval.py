"""`agentrl eval` settings without vLLM: a train run directory as MODEL (final model,
--step), k and the held-out seeds applied, what is recorded for --resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agentrl.cli import _parser
from agentrl.cli.eval import _new_job
from agentrl.errors import ConfigError
from agentrl.rollout.job import RolloutJob

CONFIG = """
[model]
path = "{base}"
[env]
id = "agentrl/Digits-v0"
[rollout]
group_size = 8
concurrency = 16
max_turns = 1
[eval]
episodes = 5
first_seed = 500
"""


def job(*argv: str) -> RolloutJob:
    args, extra = _parser().parse_known_args(["eval", *argv])
    return _new_job(args, extra)


@pytest.fixture
def run_dir(tmp_path: Path, tiny_model: Path) -> Path:
    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (run / "config.toml").write_text(CONFIG.format(base=tiny_model))
    step = run / "checkpoints" / "step-000002"
    step.mkdir(parents=True)
    (step / "trainer.json").write_text(json.dumps({"version": 2}))
    shutil.copy(tiny_model / "model.safetensors", step / "model.safetensors")
    return run


@pytest.mark.timeout(120)
def test_a_run_directory_evaluates_its_final_model_with_its_settings(
    run_dir: Path, tmp_path: Path
) -> None:
    j = job(str(run_dir), "-k", "4", "--out", str(tmp_path / "ev"))
    cfg = j.config
    assert j.kind == "eval" and j.episodes == 5 * 4
    assert cfg.model.path == str(run_dir / "model") and "final model" in j.source
    assert (cfg.env.id, cfg.env.first_seed) == ("agentrl/Digits-v0", 500)
    assert (cfg.rollout.group_size, cfg.rollout.max_turns) == (4, 1)
    assert j.settings()["job"]["episodes"] == 20


@pytest.mark.timeout(120)
def test_step_assembles_the_checkpoint_inside_the_eval_directory(
    run_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "ev"
    j = job(str(run_dir), "--step", "2", "--out", str(out), "--episodes", "3")
    assert j.config.model.path == str(out / "policy") and "step 2 (version 2)" in j.source
    assert (out / "policy" / "model.safetensors").resolve() == (
        run_dir / "checkpoints" / "step-000002" / "model.safetensors"
    ).resolve()
    assert j.episodes == 3
    with pytest.raises(ConfigError, match=r"--step 7: no checkpoint .*step-000007.*step-000002"):
        job(str(run_dir), "--step", "7", "--out", str(tmp_path / "ev2"))


@pytest.mark.timeout(120)
def test_a_refused_k_leaves_the_eval_directory_untouched(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "ev"
    with pytest.raises(ConfigError, match=r"-k 32 \(eval.k\) must be at most --concurrency 16"):
        job(str(run_dir), "--step", "2", "-k", "32", "--out", str(out))
    assert not out.exists()  # the same --out works once -k is fixed
    assert job(str(run_dir), "--step", "2", "-k", "4", "--out", str(out)).config.eval.k == 4


@pytest.mark.timeout(60)
def test_clear_errors_before_anything_starts(tmp_path: Path) -> None:
    out = ["--out", str(tmp_path / "ev")]
    with pytest.raises(ConfigError, match=r"--episodes N"):
        job("tiny", "--env", "agentrl/Digits-v0", *out)
    with pytest.raises(ConfigError, match=r"-k 8 \(eval.k\) must be at most --concurrency 4"):
        job(
            "tiny",
            "--env",
            "agentrl/Digits-v0",
            "--episodes",
            "2",
            "-k",
            "8",
            "--concurrency",
            "4",
            *out,
        )
    with pytest.raises(ConfigError, match=r"--env ID"):
        job("tiny", "--episodes", "2", *out)
    with pytest.raises(ConfigError, match=r"--step needs a run directory"):
        job("tiny", "--env", "agentrl/Digits-v0", "--episodes", "2", "--step", "1", *out)


@pytest.mark.timeout(60)
def test_the_report_names_tool_use_only_for_an_env_with_tools(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentrl.cli.eval import _print_report
    from agentrl.evaluation import eval_report
    from tests.evaluation.test_report import _episode

    monkeypatch.setenv("COLUMNS", "200")
    episodes = [_episode(t, i, 1.0) for t in range(2) for i in range(2)]
    report = eval_report(episodes, env_id="E", model="m", k=2, success_reward=1.0)
    _print_report(report, tmp_path, tools=False)
    without = capsys.readouterr().out
    _print_report(report, tmp_path)
    with_tools = capsys.readouterr().out
    assert "tool use" not in without and "tools" not in without and "turns" in without
    assert "mean reward 1.000, tool use 0.0%, " in with_tools and "tools" in with_tools

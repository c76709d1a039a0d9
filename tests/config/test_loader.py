"""The run config: TOML in, overrides, one clear error per bad field, nothing created."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from agentrl.config import RunConfig
from agentrl.errors import ConfigError
from agentrl.run import check_config

EXAMPLES = Path(__file__).parents[2] / "examples"
AGENTRL = str(Path(sys.executable).parent / "agentrl")

GOOD = """
[run]
name = "t"
[env]
id = "agentrl/Calculator-v0"
kwargs = { max_operand = 99 }
[rollout]
group_size = 4
concurrency = 16
[trainer]
lr = 1e-4
[trainer.lora]
enabled = true
r = 4
[train]
steps = 3
"""


def test_load_overrides_and_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(GOOD)
    config = RunConfig.load(
        path,
        [
            "--train.steps=7",
            "--trainer.lr=3e-4",
            "--run.name=other",
            "--log.plots=false",
            "--env.imports=[]",
        ],
    )
    assert config.train.steps == 7 and config.trainer.lr == 3e-4
    assert config.run.name == "other" and config.log.plots is False
    assert config.env.kwargs == {"max_operand": 99} and config.trainer.lora.r == 4
    assert config.rollout.concurrency == 16 and config.rollout.max_turns == 8  # default kept
    # the resolved TOML reads back to the same config, every key written out
    again = RunConfig.from_dict(tomllib.loads(config.to_toml()))
    assert again == config
    check_config(config)
    assert config.trainer.lora.enabled and config.trainer.lora.r == 4
    assert config.batch_size() == 4 * config.train.groups_per_step
    # the shorthand trainer.loss = "grpo" is the table [trainer.loss] kind = "grpo"
    assert RunConfig.load(path, ['--trainer.loss="grpo"']).trainer.loss.kind == "grpo"
    assert RunConfig.load(path, ['--trainer.loss.kind="grpo"']).trainer.loss.kind == "grpo"
    # a file that uses the shorthand still takes overrides of the section's other keys
    short = tmp_path / "short.toml"
    short.write_text(GOOD.replace("[trainer]\n", '[trainer]\nloss = "dapo"\n', 1))
    loss = RunConfig.load(short, ["--trainer.loss.gamma=0.8"]).trainer.loss
    assert (loss.kind, loss.gamma) == ("dapo", 0.8)
    with pytest.raises(ConfigError, match="'lr' is not a section"):
        RunConfig.load(short, ["--trainer.lr.x=1"])


def test_one_default_per_setting_and_a_reference_that_lists_every_key() -> None:
    """The components take the config's own sections: no second set of defaults."""
    import inspect

    from agentrl.config import RolloutConfig, TrainConfig, TrainerConfig
    from agentrl.config.reference import defaults_toml, field_docs
    from agentrl.rollout.runner import EpisodeRunner
    from agentrl.rollout.scheduler import Scheduler
    from agentrl.trainer.loop import TrainLoop
    from agentrl.trainer.trainer import Trainer

    for component, section in (
        (EpisodeRunner, RolloutConfig),
        (Scheduler, RolloutConfig),
        (Trainer, TrainerConfig),
        (TrainLoop, TrainConfig),
    ):
        annotation = inspect.signature(component).parameters["config"].annotation
        assert section.__name__ in str(annotation), (component, annotation)
    text = defaults_toml()
    parsed = tomllib.loads(text)
    assert RunConfig.from_dict(parsed) == RunConfig()  # the reference is the defaults
    docs = field_docs()
    import dataclasses

    def walk(cls: type) -> None:
        for f in dataclasses.fields(cls):
            assert (cls.__name__, f.name) in docs, f"{cls.__name__}.{f.name} has no doc line"
            if dataclasses.is_dataclass(
                f.default_factory if f.default_factory is not dataclasses.MISSING else None
            ):
                walk(f.default_factory)  # type: ignore[arg-type]

    walk(RunConfig)
    proc = subprocess.run(
        [AGENTRL, "config", "--defaults"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and proc.stdout == text


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ("--rollout.grup_size=3", ["rollout.grup_size", "group_size"]),
        ('--trainer.loss="ppo"', ["trainer.loss", "'ppo'", "grpo", "dapo"]),
        ("--train.steps=0", ["train.steps", "0", "at least 1"]),
        ("--train.steps=2.5", ["train.steps", "2.5", "integer"]),
        ("--trainer.lr=-1.0", ["trainer.lr", "-1.0", "> 0"]),
        ('--train.mode="fast"', ["train.mode", "'fast'", "async", "sync"]),
        ("--rollout.concurrency=2", ["concurrency", "group_size"]),
        ("--rollout.max_tokens_per_turn=4096", ["max_tokens_per_turn", "max_model_len"]),
        ('--env.id="agentrl/Nope-v0"', ["env.id", "Nope", "env.imports"]),
        ("--env.kwargs={colour=1}", ["env.kwargs", "colour"]),
        ('--model.path="/no/such/model"', ["/no/such/model", "does not exist"]),
        ("--log.tensorboard=1", ["log.tensorboard", "true or false"]),
        ('--inference.mode="cloud"', ["inference.mode", "engine", "server"]),
        ("--eval.episodes=-3", ["eval.episodes", "-3", ">= 0"]),
        ("--rollout.env_timeout_s=0", ["rollout.env_timeout_s", "0", "> 0"]),
        ("--rollout.tool_timeout_s=-1.0", ["rollout.tool_timeout_s", "-1.0", "> 0"]),
        ('--rollout.worker_event_loop="trio"', ["rollout.worker_event_loop", "trio", "uvloop"]),
        ("--trainer.lora=5", ["trainer.lora", "table"]),
        ('--env.imports=["no_such_module_x"]', ["env.imports", "no_such_module_x"]),
    ],
)
def test_each_bad_field_names_key_value_and_what_is_allowed(
    tmp_path: Path, override: str, names: list[str]
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(GOOD)
    with pytest.raises(ConfigError) as info:
        check_config(RunConfig.load(path, [override]))
    message = str(info.value)
    for name in names:
        assert name in message, (name, message)


def test_bad_toml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\nname = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        RunConfig.load(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        RunConfig.load(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match=r"--section\.key=value"):
        RunConfig.load(None, ["train.steps"])


def test_cli_bad_config_prints_one_error_and_creates_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    path = tmp_path / "c.toml"
    path.write_text(GOOD + '\n[log]\nprogress = "plain"\n')
    proc = subprocess.run(
        [AGENTRL, "train", str(path), f'--run.out="{out}"', '--trainer.loss="ppo"'],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [
        "agentrl: error: trainer.loss.kind = 'ppo' is not allowed; use one of: grpo, dapo, "
        "dr_grpo, cispo, bnpo, dppo"
    ], proc.stderr
    assert proc.stdout == ""
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]


def test_cli_refuses_a_used_run_dir_and_a_resume_of_nothing(tmp_path: Path) -> None:
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    path = tmp_path / "c.toml"
    path.write_text(GOOD)
    proc = subprocess.run(
        [AGENTRL, "train", str(path), f'--run.out="{used}"'],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and "--resume" in proc.stderr
    assert sorted(p.name for p in used.iterdir()) == ["keep.txt"]
    proc = subprocess.run(
        [AGENTRL, "train", "--resume", str(used)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1 and "no `agentrl train` run to resume" in proc.stderr


def test_a_resume_reads_the_store_and_writes_nothing_before_the_run(tmp_path: Path) -> None:
    """--resume checks the run's store before anything is written: a store that cannot be
    continued (here another program's SQLite file) is refused and left as it was; an
    empty one, left by a run stopped while making its store, is let through unchanged
    (the run makes it, as starting would have)."""
    import sqlite3

    from agentrl.errors import StoreError
    from agentrl.run import CONFIG_FILE, prepare

    run = tmp_path / "run"
    run.mkdir()
    (run / CONFIG_FILE).write_text(GOOD)
    db = sqlite3.connect(run / "episodes.db")
    db.execute("CREATE TABLE users (name TEXT)")
    db.close()
    before = (run / "episodes.db").read_bytes()
    with pytest.raises(StoreError, match=r"holds tables \['users'\] but no agentrl"):
        prepare(None, [], resume=str(run))
    assert (run / "episodes.db").read_bytes() == before
    (run / "episodes.db").write_bytes(b"")
    _, run_dir = prepare(None, [], resume=str(run))
    assert run_dir == run and (run / "episodes.db").read_bytes() == b""
    assert sorted(p.name for p in run.iterdir()) == [CONFIG_FILE, "episodes.db"]


@pytest.mark.parametrize(
    "path",
    sorted([*EXAMPLES.glob("*/config.toml"), *EXAMPLES.glob("scale_out/*.toml")]),
    ids=lambda p: f"{p.parent.name}/{p.stem}",
)
def test_example_configs_are_valid(path: Path) -> None:
    check_config(RunConfig.load(path))

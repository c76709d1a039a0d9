"""Bad input to `agentrl train`: one clear error, exit code 1, nothing created or changed.

Each case runs the real CLI in a subprocess and checks: exactly one ``agentrl: error:``
line naming what was wrong, no traceback, and every file it was given byte-for-byte
as before (a run directory that was not there is still not there).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agentrl.store import EpisodeStore
from tests.faults.harness import AGENTRL, agentrl_env, digits_config


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _train(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    proc = subprocess.run(
        [AGENTRL, "train", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )
    return proc.returncode, proc.stdout + proc.stderr


def _one_error(output: str) -> str:
    errors = [ln for ln in output.splitlines() if ln.startswith("agentrl: error:")]
    assert len(errors) == 1 and "Traceback" not in output, output[-3000:]
    return errors[0]


def _run_dir(tmp_path: Path) -> Path:
    """A run directory as `agentrl train` leaves it (config.toml and a store with a task)."""
    from agentrl.config import RunConfig
    from agentrl.types import Task

    run = tmp_path / "run"
    run.mkdir()
    cfg = RunConfig.load(digits_config(tmp_path))
    (run / "config.toml").write_text(cfg.to_toml())
    with EpisodeStore.open(run) as store:
        store.begin_run("train", cfg.to_dict())
        store.add_tasks([Task("t0", "agentrl/Digits-v0", 0)], 8)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    return run


def _not_a_model(tmp_path: Path, tiny_model: Path) -> tuple[str, str]:
    folder = tmp_path / "junk"
    folder.mkdir()
    (folder / "notes.txt").write_text("not a model")
    return str(folder), "is not a model folder: it has no config.json"


def _no_weights(tmp_path: Path, tiny_model: Path) -> tuple[str, str]:
    folder = tmp_path / "no-weights"
    shutil.copytree(tiny_model, folder)
    for f in folder.glob("*.safetensors"):
        f.unlink()
    return str(folder), "has a config.json but no weights"


def _no_chat_template(tmp_path: Path, tiny_model: Path) -> tuple[str, str]:
    folder = tmp_path / "no-template"
    shutil.copytree(tiny_model, folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return str(folder), "has no chat template"


@pytest.mark.parametrize(
    "case",
    [_not_a_model, _no_weights, _no_chat_template],
    ids=["not-a-model", "no-weights", "no-chat-template"],
)
def test_a_model_path_that_cannot_be_used_is_refused_before_anything_is_created(
    tmp_path: Path, tiny_model: Path, model_cache: Path, case: Any, record_fault: Any
) -> None:
    model, expected = case(tmp_path, tiny_model)
    before = _snapshot(Path(model))
    run_dir = tmp_path / "run"
    rc, out = _train(
        [str(digits_config(tmp_path)), f'--model.path="{model}"', f'--run.out="{run_dir}"'],
        agentrl_env(model_cache),
        tmp_path,
    )
    error = _one_error(out)
    record_fault(
        f"bad input: model path ({case.__name__.strip('_').replace('_', ' ')})",
        injected=1,
        survived=int(rc == 1),
        lost=0,
    )
    assert rc == 1 and expected in error and model in error, error
    assert not run_dir.exists()
    assert _snapshot(Path(model)) == before


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("--rollout.group_size=0", "rollout.group_size"),
        ('--trainer.lr="fast"', "trainer.lr"),
        ("--rollout.bogus=1", "rollout.bogus"),
        ('--inference.servers=["127.0.0.1:8000"]', "inference.servers"),
        ('--env.id="nope/Nothing-v0"', "env.id"),
    ],
)
def test_a_bad_config_field_is_one_clear_error(
    tmp_path: Path, model_cache: Path, override: str, expected: str, record_fault: Any
) -> None:
    run_dir = tmp_path / "run"
    rc, out = _train(
        [str(digits_config(tmp_path)), override, f'--run.out="{run_dir}"'],
        agentrl_env(model_cache),
        tmp_path,
    )
    error = _one_error(out)
    record_fault(f"bad input: config `{override}`", injected=1, survived=int(rc == 1), lost=0)
    assert rc == 1 and expected in error, error
    assert not run_dir.exists()


def _corrupt(run: Path) -> str:
    db = run / "episodes.db"
    data = bytearray(db.read_bytes())
    data[:100] = b"\x13" * 100  # the SQLite header is gone
    db.write_bytes(bytes(data))
    return "is not a readable SQLite episode store"


def _newer(run: Path) -> str:
    conn = sqlite3.connect(run / "episodes.db")
    conn.execute("PRAGMA user_version = 999")
    conn.close()
    return "was written by a newer agentrl (store schema 999"


@pytest.mark.parametrize("damage", [_corrupt, _newer], ids=["corrupt", "newer-schema"])
def test_resume_of_a_store_it_cannot_read_changes_nothing(
    tmp_path: Path, model_cache: Path, damage: Any, record_fault: Any
) -> None:
    run = _run_dir(tmp_path)
    expected = damage(run)
    before = _snapshot(run)
    rc, out = _train(["--resume", str(run)], agentrl_env(model_cache), tmp_path)
    error = _one_error(out)
    after = _snapshot(run)
    record_fault(
        f"bad input: store file ({damage.__name__.strip('_')})",
        injected=1,
        survived=int(rc == 1),
        lost=int(after != before),
    )
    assert rc == 1 and expected in error and "episodes.db" in error, error
    assert after == before

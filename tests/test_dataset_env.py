"""DatasetEnv: rows of a local JSONL as tasks, verifiers (plain and TRL), seeds, splits,
the env checks, `[env] dataset = ...`, and the clear errors bad data gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.check import check_env
from agentrl.config import RunConfig
from agentrl.config.sections import DATASET_ENV_ID
from agentrl.dataset_env import DatasetEnv
from agentrl.env import make_env
from agentrl.errors import ConfigError

VERIFIERS = """
import re

def exact(completion, answer):
    numbers = re.findall(r"-?\\d+", completion)
    return bool(numbers) and numbers[-1] == str(answer)

def trl_reward(prompts, completions, answer, **kwargs):
    return [float(str(a) in c) for c, a in zip(completions, answer)]

def broken(completion, answer):
    raise KeyError("no such field")

def picky(completion, answer):
    if completion == "boom":
        raise ValueError("cannot score boom")
    return 0.0
"""


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def data(tmp_path: Path) -> Path:
    rows = [{"question": f"What is {i} + {i}?", "answer": 2 * i} for i in range(5)]
    return write_jsonl(tmp_path / "problems.jsonl", rows)


@pytest.fixture
def verifiers(tmp_path: Path) -> str:
    (tmp_path / "verifiers.py").write_text(VERIFIERS)
    return str(tmp_path / "verifiers.py")


def make(data: Path, verifiers: str, fn: str = "exact", **kwargs: object) -> DatasetEnv:
    return DatasetEnv(str(data), verifier=f"{verifiers}:{fn}", prompt_column="question", **kwargs)  # type: ignore[arg-type]


@pytest.mark.timeout(60)
def test_seeds_map_to_rows_and_the_plain_verifier_scores(data: Path, verifiers: str) -> None:
    env = make(data, verifiers)
    assert env.reset(seed=3) == ("What is 3 + 3?", {"row": 3})
    assert env.step("the answer is 6")[1:3] == (1.0, True)
    assert env.reset(seed=8)[0] == "What is 3 + 3?"  # 8 % 5 rows
    assert env.step("7")[1] == 0.0
    assert env.reset(seed=1_000_000)[0] == "What is 0 + 0?"


@pytest.mark.timeout(60)
def test_trl_reward_function_signature(data: Path, verifiers: str) -> None:
    env = make(data, verifiers, "trl_reward")
    assert env.verifier.trl
    env.reset(seed=2)
    assert env.step("4")[1] == 1.0
    env.reset(seed=2)
    assert env.step("5")[1] == 0.0


@pytest.mark.timeout(120)
def test_check_env_passes(data: Path, verifiers: str) -> None:
    kwargs = {"dataset": str(data), "verifier": f"{verifiers}:exact", "prompt_column": "question"}
    results = check_env(lambda: make_env(DATASET_ENV_ID, **kwargs), raise_on_failure=False)
    assert all(r.passed for r in results), [(r.rule, r.detail) for r in results]


@pytest.mark.timeout(60)
def test_splits_by_name_from_a_folder(tmp_path: Path, verifiers: str) -> None:
    folder = tmp_path / "ds"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", [{"prompt": "train q", "answer": 1}])
    write_jsonl(folder / "test.jsonl", [{"prompt": "test q", "answer": 2}])
    for split, prompt in (("train", "train q"), ("test", "test q")):
        env = DatasetEnv(str(folder), verifier=f"{verifiers}:exact", split=split)
        assert env.reset(seed=0)[0] == prompt
    with pytest.raises(ConfigError, match=r"env.kwargs.split = 'validation'"):
        DatasetEnv(str(folder), verifier=f"{verifiers}:exact", split="validation")


@pytest.mark.timeout(60)
def test_config_dataset_key_sets_the_env(data: Path, verifiers: str) -> None:
    config = RunConfig.from_dict(
        {
            "env": {
                "dataset": str(data),
                "kwargs": {"verifier": f"{verifiers}:exact", "prompt_column": "question"},
            }
        }
    )
    assert config.env.id == DATASET_ENV_ID
    assert config.env.kwargs["dataset"] == str(data)
    recorded = json.loads(json.dumps(config.to_dict()))  # as a run records it
    assert RunConfig.from_dict(recorded) == config
    env = make_env(config.env.id, **config.env.kwargs)
    assert env.reset(seed=4)[0] == "What is 4 + 4?"
    with pytest.raises(ConfigError, match=r"leave env.id empty"):
        RunConfig.from_dict({"env": {"dataset": str(data), "id": "agentrl/Calculator-v0"}})


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing-file", r"env.dataset = '.*nope.jsonl': no such file"),
        ("missing-column", r"'question' is not a column .* columns: \['answer', 'q'\]"),
        ("empty", r"env.kwargs.split = 'train' of .* is empty"),
        ("bad-verifier-name", r"env.kwargs.verifier = .*has no function 'nope'"),
        ("verifier-raises", r"failed on row 0 with an empty answer: KeyError"),
        ("bad-format", r"a .txt file; give .jsonl"),
    ],
)
def test_bad_data_gives_a_clear_error(
    tmp_path: Path, verifiers: str, data: Path, case: str, message: str
) -> None:
    path, fn = data, "exact"
    if case == "missing-file":
        path = tmp_path / "nope.jsonl"
    elif case == "missing-column":
        path = write_jsonl(tmp_path / "other.jsonl", [{"q": "x", "answer": 1}])
    elif case == "empty":
        path = tmp_path / "empty.jsonl"
        path.write_text("")
    elif case == "bad-verifier-name":
        fn = "nope"
    elif case == "verifier-raises":
        fn = "broken"
    elif case == "bad-format":
        path = tmp_path / "rows.txt"
        path.write_text("x\n")
    with pytest.raises(ConfigError, match=message):
        make(path, verifiers, fn)


@pytest.mark.timeout(60)
def test_a_verifier_that_raises_later_fails_only_that_episode(data: Path, verifiers: str) -> None:
    env = make(data, verifiers, "picky")
    env.reset(seed=1)
    assert env.step("fine")[1] == 0.0
    env.reset(seed=1)
    with pytest.raises(RuntimeError, match=r"verifier .*:picky raised on row 1: ValueError"):
        env.step("boom")  # the rollout engine records this as a failed episode


@pytest.mark.timeout(60)
@pytest.mark.parametrize("spec", ["data/nope.jsonl", "data/nope", "./nope", "nope.parquet"])
def test_a_missing_local_path_is_said_at_once_and_never_tried_on_the_hub(
    tmp_path: Path, verifiers: str, monkeypatch: pytest.MonkeyPatch, spec: str
) -> None:
    """A spec that looks like a path (a data file's suffix, a folder that exists) is
    looked for here only; before, "data/nope.jsonl" went to the hub: 30 s, then an error
    about the hub."""
    import time

    from agentrl.config.sections import EnvConfig
    from agentrl.env import check_env_config

    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    env = EnvConfig(dataset=spec, kwargs={"verifier": f"{verifiers}:exact"})
    started = time.monotonic()
    with pytest.raises(ConfigError) as raised:
        check_env_config(env)  # what train, rollout and eval run before vLLM starts
    took = time.monotonic() - started
    folder = str((tmp_path / spec).parent)
    assert f"env.dataset = {spec!r}: no such file or folder; looked in {folder!r}" in str(
        raised.value
    ), raised.value
    assert "hub" not in str(raised.value).split(";")[0].lower()
    assert took < 2.0, f"{took:.1f} s"


def test_hub_names_are_not_taken_for_local_paths(tmp_path: Path) -> None:
    from agentrl.dataset_env import _looks_local

    assert not _looks_local("gsm8k") and not _looks_local("openai/gsm8k")
    assert _looks_local("data/x.csv") and _looks_local("../x") and _looks_local("a/b/c")

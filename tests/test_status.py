"""The run's status knows what applies to it: tools (made from the real shipped envs) and
the training mode; the evaluation's line says tool use only where there are tools."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.config import EnvConfig, RunConfig
from agentrl.evaluation import eval_line
from agentrl.runtime.metrics import Metrics
from agentrl.status import RunStatus, env_offers_tools

SUMMARY = {
    "label": "after",
    "step": 4,
    "version": 4,
    "episodes": 16,
    "k": 1,
    "success_rate": 0.75,
    "tool_use_rate": 0.0,
    "reward_mean": 0.75,
}


@pytest.mark.timeout(60)
def test_env_offers_tools_reads_the_env() -> None:
    assert env_offers_tools(EnvConfig(id="agentrl/Calculator-v0"))
    assert not env_offers_tools(EnvConfig(id="agentrl/GuessNumber-v0"))
    assert env_offers_tools(EnvConfig(id="agentrl/Sql-v0"))  # tools set per instance
    # not known here: shown
    assert env_offers_tools(EnvConfig(url="http://127.0.0.1:9"))


@pytest.mark.timeout(60)
def test_the_status_file_says_whether_tools_and_staleness_apply(tmp_path: Path) -> None:
    config = RunConfig.from_dict(
        {"env": {"id": "agentrl/GuessNumber-v0"}, "train": {"mode": "sync"}}
    )
    snapshot = RunStatus(config, tmp_path, Metrics()).snapshot()
    assert snapshot["tools"] is False and snapshot["mode"] == "sync"
    config = RunConfig.from_dict({"env": {"id": "agentrl/Calculator-v0"}})
    snapshot = RunStatus(config, tmp_path, Metrics()).snapshot()
    assert snapshot["tools"] is True and snapshot["mode"] == "async"


@pytest.mark.timeout(30)
def test_eval_line_names_tool_use_only_with_tools() -> None:
    assert eval_line(SUMMARY) == (
        "eval after (version 4, 16 held-out episodes): success 75.0%, tool use 0.0%, "
        "mean reward 0.750"
    )
    assert eval_line(SUMMARY, tools=False) == (
        "eval after (version 4, 16 held-out episodes): success 75.0%, mean reward 0.750"
    )


@pytest.mark.timeout(60)
def test_the_placement_gathers_every_source_by_piece(tmp_path: Path) -> None:
    """The trainer ranks' source is added first (before the run starts), the services'
    (env servers started before inference servers) and the workers' later (in the order
    they were placed): status.json lists inference, env, worker, trainer, each piece by
    index, and reads every source anew at each snapshot."""
    config = RunConfig.from_dict({"env": {"id": "agentrl/GuessNumber-v0"}})
    status = RunStatus(config, tmp_path, Metrics())
    assert status.snapshot()["placement"] == []  # one machine: no rows
    ranks = [{"piece": "trainer", "index": 0}, {"piece": "trainer", "index": 1}]
    services = [{"piece": "env", "index": 0}, {"piece": "inference", "index": 0}]
    services.append({"piece": "inference", "index": 1})
    workers: list[dict[str, object]] = []
    for source in (ranks, services, workers):
        status.add_placement(lambda rows=source: list(rows))
    workers += [{"piece": "worker", "index": 1, "state": "alive"}, {"piece": "worker", "index": 0}]
    listed = [(r["piece"], r["index"]) for r in status.snapshot()["placement"]]
    assert listed == [
        ("inference", 0),
        ("inference", 1),
        ("env", 0),
        ("worker", 0),
        ("worker", 1),
        ("trainer", 0),
        ("trainer", 1),
    ]
    workers[0]["state"] = "dead"
    assert status.snapshot()["placement"][4] == {"piece": "worker", "index": 1, "state": "dead"}

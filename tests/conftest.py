"""Shared fixtures: the tiny model (built once per session), weights derived from it, and a
vLLM engine serving it (once per module that asks)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_configure(config: pytest.Config) -> None:
    """Whatever the tests start (vllm serve, engines, `agentrl train` subprocesses) is
    stopped by agentrl's watchdog if pytest itself is killed (a CI timeout)."""
    from agentrl.runtime.stopping import ensure_reaper

    ensure_reaper()


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model cache private to this test session."""
    return tmp_path_factory.mktemp("agentrl-cache")


@pytest.fixture(scope="session")
def tiny_model(model_cache: Path) -> Path:
    from agentrl.models.tiny import build_tiny_model

    return build_tiny_model(cache_dir=model_cache)


@pytest.fixture(scope="session")
def perturbed_weights(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Safetensors of the tiny model with every weight changed (same architecture)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.2 * torch.randn(param.shape, generator=generator))
    out = tmp_path_factory.mktemp("perturbed")
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def lora_adapter(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A peft LoRA adapter for the tiny model with non-zero weights."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(2)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    config = LoraConfig(
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        init_lora_weights=False,  # random A and B, so the adapter changes the output
    )
    peft_model = get_peft_model(model, config)
    out = tmp_path_factory.mktemp("lora")
    peft_model.save_pretrained(out)
    return out


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(tiny_model: Path) -> AsyncIterator[Any]:
    """An in-process vLLM engine serving the tiny model (started once per test module)."""
    from agentrl.inference.engine import VLLMEngineClient

    engine = await VLLMEngineClient.start(str(tiny_model))
    try:
        yield engine
    finally:
        await engine.close()


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


# ---- the fault table -------------------------------------------------------------------
# Every fault test records what it injected and what it found with the record_fault
# fixture (the measured values, recorded before the test asserts on them, so a failing
# test shows what it saw). The table is printed at the end of the session; with
# AGENTRL_FAULT_TABLE=FILE it is also written there as Markdown (`make soak`).

_ROWS: list[dict[str, Any]] = []


@pytest.fixture
def record_fault(request: pytest.FixtureRequest) -> Callable[..., None]:
    def record(
        fault: str,
        *,
        injected: int,
        survived: int,
        lost: int,
        trained_twice: int = 0,
        runs: int | None = None,
    ) -> None:
        _ROWS.append(
            {
                "fault": fault,
                "injected": injected,
                "runs": runs or injected,
                "survived": survived,
                "lost": lost,
                "trained_twice": trained_twice,
                "test": request.node.originalname,
            }
        )

    return record


def fault_table() -> str:
    lines = [
        "| Fault | Injected | Runs survived | Trajectories lost | Tasks trained twice | Test |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in _ROWS:
        lines.append(
            f"| {r['fault']} | {r['injected']} | {r['survived']}/{r['runs']} | "
            f"{r['lost']} | {r['trained_twice']} | `{r['test']}` |"
        )
    total = {
        k: sum(r[k] for r in _ROWS)
        for k in ("injected", "runs", "survived", "lost", "trained_twice")
    }
    lines.append(
        f"| **all** | {total['injected']} | {total['survived']}/{total['runs']} | "
        f"{total['lost']} | {total['trained_twice']} | |"
    )
    return "\n".join(lines)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _ROWS:
        return
    table = fault_table()
    terminalreporter.section("fault injection")
    terminalreporter.write_line(table)
    target = os.environ.get("AGENTRL_FAULT_TABLE")
    if target:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(table + "\n")


@pytest.fixture(autouse=True)
def _end_test_processes() -> Any:
    """Kill whatever a test's Proc subprocesses left running (their process groups)."""
    yield
    from tests.faults.harness import Proc

    while Proc.live:
        Proc.live.pop().kill()


_DISTRIBUTED_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def _no_rank_left_behind() -> Any:
    """Fail the test that leaves torch.distributed's variables in this process: every
    later test that builds an accelerate or transformers trainer would wait forever in a
    rendezvous with ranks that are gone (pytest-timeout cannot stop a wait in C)."""
    before = {name: os.environ.get(name) for name in _DISTRIBUTED_ENV}
    yield
    left = [name for name in _DISTRIBUTED_ENV if os.environ.get(name) != before[name]]
    for name in left:
        if before[name] is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before[name]
    assert not left, f"the test left {left} set in the test process (restore them)"

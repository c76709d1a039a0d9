"""Trainer checkpoints restore everything exactly; a kill mid-write leaves the last one."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from agentrl.config import LoraConfig, LossConfig, TrainerConfig
from agentrl.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from agentrl.trainer.trainer import Trainer
from agentrl.types import Group, Task, TokenSpan, Trajectory


def synthetic_groups(seed: int, groups: int = 2, size: int = 3) -> list[Group]:
    """Groups of random trajectories: a prompt, a sampled reply, random rewards."""
    rng = np.random.default_rng(seed)
    out = []
    for g in range(groups):
        task = Task(f"t#{g}", "none", g)
        trajectories = []
        for i in range(size):
            prompt, reply = int(rng.integers(4, 9)), int(rng.integers(3, 8))
            n = prompt + reply
            mask = np.r_[np.zeros(prompt), np.ones(reply)].astype(np.int8)
            trajectories.append(
                Trajectory(
                    episode_id=f"t#{g}/{i}",
                    task_id=task.task_id,
                    env_id="none",
                    seed=g,
                    token_ids=rng.integers(7, 500, n),
                    loss_mask=mask,
                    logprobs=np.where(mask == 1, -rng.random(n) * 3, np.nan),
                    versions=np.where(mask == 1, 0, -1),
                    spans=(TokenSpan("prompt", 0, prompt, 0), TokenSpan("assistant", prompt, n, 0)),
                    messages=[],
                    turn_rewards=[float(rng.random())],
                    reward=float(rng.random()),
                    status="finished",
                )
            )
        out.append(Group(task, size, trajectories))
    return out


def same_state(a: Trainer, b: Trainer) -> None:
    for (name, pa), (_, pb) in zip(
        a.model.named_parameters(), b.model.named_parameters(), strict=True
    ):
        assert torch.equal(pa, pb), name
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys() and sa["state"]
    for index, state in sa["state"].items():
        for key, value in state.items():
            other = sb["state"][index][key]
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(other)), (index, key)
    assert (a.step, a.version) == (b.step, b.version)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_resume_restores_step_optimizer_version_and_rng_exactly(
    tmp_path: Path, tiny_model: Path, lora: bool
) -> None:
    config = TrainerConfig(
        lr=1e-3,
        loss=LossConfig("dapo", correction="token_truncate"),
        lora=LoraConfig(enabled=lora, r=4),
    )
    a = Trainer(str(tiny_model), config, temperature=1.0, seed=0)
    for step in range(2):
        a.train_step(synthetic_groups(step))
    a.set_version(2)
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    folder = save_checkpoint(a, tmp_path / "ckpt")
    assert latest_checkpoint(tmp_path / "ckpt") == folder
    expected_rng = (random.random(), np.random.random(), torch.rand(1).item())
    if lora:
        assert not (folder / "model.safetensors").exists(), "LoRA checkpoints hold the adapter"
    b = Trainer(
        str(tiny_model), config, temperature=1.0, seed=0
    )  # a new process would start like this
    load_checkpoint(b, folder)
    same_state(a, b)
    assert (random.random(), np.random.random(), torch.rand(1).item()) == expected_rng
    # and training goes on identically
    torch.manual_seed(3)
    a.train_step(synthetic_groups(5))
    torch.manual_seed(3)
    b.train_step(synthetic_groups(5))
    same_state(a, b)


def test_a_kill_while_writing_leaves_the_previous_checkpoint(
    tmp_path: Path, tiny_model: Path
) -> None:
    trainer = Trainer(str(tiny_model), TrainerConfig(lr=1e-3), temperature=1.0, seed=0)
    trainer.train_step(synthetic_groups(0))
    first = save_checkpoint(trainer, tmp_path)
    trainer.train_step(synthetic_groups(1))
    # what a kill in the middle of the next save leaves behind: a half-written temp folder
    partial = tmp_path / ".step-000002.tmp-12345"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half a file")
    assert latest_checkpoint(tmp_path) == first
    restored = Trainer(str(tiny_model), TrainerConfig(lr=1e-3), temperature=1.0, seed=0)
    load_checkpoint(restored, latest_checkpoint(tmp_path))
    assert restored.step == 1


def test_the_nccl_sender_refuses_without_cuda(tiny_model: Path) -> None:
    from agentrl.errors import WeightSyncError
    from agentrl.trainer.nccl import NCCLWeightSender, nccl_available

    if nccl_available():
        pytest.skip("this machine has CUDA; tests/trainer/test_nccl_gpu.py covers the path")
    trainer = Trainer(str(tiny_model), TrainerConfig(), temperature=1.0, seed=0)
    with pytest.raises(WeightSyncError, match="needs CUDA; on this machine publish through files"):
        NCCLWeightSender(trainer.model, control=None)

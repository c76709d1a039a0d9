"""On CPU the trainer borrows vLLM's core while no episode is being generated, and
gives it back before the next micro-step once generation runs again."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from agentrl.config.sections import TrainerConfig
from agentrl.trainer.trainer import Trainer
from agentrl.types import Group, Task
from benchmarks.bench_cpu_trainer import _trajectory

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2+ cores")


def _groups(trainer: Trainer, n: int = 4) -> list[Group]:
    rng = np.random.default_rng(0)
    vocab = trainer.model.get_input_embeddings().num_embeddings
    return [
        Group(Task(f"t{g}", "bench", g), 4, [_trajectory(rng, g, i, vocab) for i in range(4)])
        for g in range(n)
    ]


def test_micro_steps_take_every_core_only_while_generation_is_idle(tiny_model: Path) -> None:
    import concurrent.futures

    cores = set(os.sched_getaffinity(0))
    # small micro-batches: several micro-steps per step, so the lender is asked often
    trainer = Trainer(
        str(tiny_model), TrainerConfig(micro_batch_tokens=1024), temperature=1.0, seed=0
    )
    groups = _groups(trainer)
    answers = iter([True, True, False, True, False, False, True, True, True, True])
    seen: list[tuple[bool, int, set[int]]] = []

    def lender() -> bool:
        # what the previous micro-step ran with, then the answer for the next one
        seen.append((trainer._on_every_core, torch.get_num_threads(), os.sched_getaffinity(0)))
        return next(answers)

    def step() -> tuple[int, set[int], dict[str, int]]:
        trainer.pin()
        trainer.lend_cores = lender
        trainer.train_step(groups)
        return torch.get_num_threads(), os.sched_getaffinity(0), dict(trainer.micro_steps)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # the trainer's own thread
        threads, affinity, counts = pool.submit(step).result()
    assert counts["all"] >= 4, "several micro-steps"
    asked = counts["all"]
    expected = [True, True, False, True, False, False, True, True, True, True][:asked]
    assert counts["every_core"] == sum(expected)
    # each micro-step ran with what the lender said just before it
    for (was_lent, n_threads, cpus), lent in zip(seen[1:], expected, strict=False):
        assert was_lent == lent
        assert (n_threads, cpus) == ((len(cores), cores) if lent else (1, cores - {0}))
    # after the step, vLLM's core is given back
    assert (threads, affinity) == (1, cores - {0})


@pytest.mark.parametrize("borrow", [True, False])
def test_the_loop_lends_the_schedulers_idle_signal_only_when_asked(
    tiny_model: Path, borrow: bool
) -> None:
    from agentrl.config.sections import TrainConfig
    from agentrl.trainer.loop import TrainLoop

    class Idle:
        in_flight = 0

        def generation_idle(self) -> bool:
            return self.in_flight == 0

    trainer = Trainer(
        str(tiny_model), TrainerConfig(borrow_idle_cores=borrow), temperature=1.0, seed=0
    )
    scheduler = Idle()
    TrainLoop(trainer, None, scheduler, None, TrainConfig())  # type: ignore[arg-type]
    if not borrow:
        assert trainer.lend_cores is None
        return
    assert trainer.lend_cores is not None and trainer.lend_cores()
    scheduler.in_flight = 3
    assert not trainer.lend_cores()

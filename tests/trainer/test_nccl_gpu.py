"""The NCCL weight path on a GPU: trainer weights broadcast into a running vLLM engine.

Skipped without CUDA (CI and the CPU development machines have none); run where a
GPU is lent: ``pytest tests/trainer/test_nccl_gpu.py -s``. It prints the sync time
against the model size.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.trainer.nccl import nccl_available

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not nccl_available(), reason="the NCCL weight path needs a CUDA GPU"),
    pytest.mark.asyncio(loop_scope="function"),
]


async def test_nccl_publish_changes_what_vllm_samples(tiny_model: Path, tmp_path: Path) -> None:
    import torch

    from agentrl.config import TrainerConfig
    from agentrl.inference.base import InferenceConfig, SamplingConfig
    from agentrl.inference.engine import VLLMEngineClient
    from agentrl.rollout import EpisodeRunner
    from agentrl.rollout.controller import RolloutController
    from agentrl.trainer.nccl import NCCLWeightSender
    from agentrl.trainer.publish import WeightPublisher
    from agentrl.trainer.trainer import Trainer

    config = InferenceConfig(
        dtype="float32", enforce_eager=False, kv_cache_mib=1024, weight_transfer="nccl"
    )
    async with await VLLMEngineClient.start(str(tiny_model), config) as engine:
        trainer = Trainer(str(tiny_model), TrainerConfig(lr=1e-3), temperature=1.0, seed=0)
        trainer.model.to("cuda")
        with torch.no_grad():
            for p in trainer.model.parameters():
                p.add_(0.2 * torch.randn_like(p))
        controller = RolloutController(EpisodeRunner(engine, trainer.tokenizer))
        sender = NCCLWeightSender.for_engine(trainer.model, engine)
        publisher = WeightPublisher(trainer, controller, sender=sender)
        prompt = trainer.tokenizer.encode("Write some digits.")
        sampling = SamplingConfig(max_tokens=8, temperature=1.0, seed=0)
        before = await engine.generate(prompt, sampling, "before")
        stats = await publisher.publish()
        after = await engine.generate(prompt, sampling, "after")
        assert stats.kind == "nccl" and engine.version == 1 and after.version == 1
        # vLLM now scores with the trainer's weights: compare logprobs of its own sample
        ids = torch.tensor([prompt + list(after.token_ids)], device="cuda")
        with torch.no_grad():
            logits = trainer.model(ids).logits[0, len(prompt) - 1 : -1]
        ours = torch.log_softmax(logits.float(), -1).gather(
            1, torch.tensor(after.token_ids, device="cuda")[:, None]
        )[:, 0]
        gap = (ours.cpu() - torch.tensor(after.logprobs)).abs().mean().item()
        print(
            f"\nNCCL sync of {stats.bytes} bytes in {stats.save_s * 1000:.1f} ms; "
            f"pause-to-resume {stats.update.pause_to_resume_s * 1000:.1f} ms; gap {gap:.2e}"
        )
        assert gap < 1e-3
        assert before.token_ids != after.token_ids or before.logprobs != after.logprobs
        sender.close()

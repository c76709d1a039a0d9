"""NCCL weight sync (trainer -> running vLLM engine) time against model size. GPU only.

    python benchmarks/bench_nccl_sync.py [--sizes 20m,300m,1b] [--updates 4]

For each size a Qwen2-architecture model is built locally with random weights (no hub),
vLLM serves it in this process with ``weight_transfer="nccl"``, and a trainer on the
same GPU publishes perturbed weights ``--updates`` times through vLLM's NCCL
weight-transfer engine (packed buckets) inside the pause/resume protocol. Reported per
size: parameters, bytes sent, send time (p50), pause-to-resume (p50), GB/s, and the
mean |trainer - vLLM| logprob gap after the last update (it must be ~0: vLLM really
serves the new weights).

Without CUDA it says so and exits 0 (these development machines have no GPU).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES = {
    # name: (hidden, layers, heads, kv heads, intermediate)
    "20m": (512, 8, 8, 2, 1408),
    "300m": (1024, 24, 16, 4, 2816),
    "1b": (2048, 24, 32, 8, 5632),
}


async def one_size(name: str, updates: int, cache: Path) -> dict:
    import torch

    from agentrl.config import TrainerConfig
    from agentrl.inference.base import InferenceConfig, SamplingConfig
    from agentrl.inference.engine import VLLMEngineClient
    from agentrl.models.tiny import TinyModelConfig, build_tiny_model
    from agentrl.rollout import EpisodeRunner
    from agentrl.rollout.controller import RolloutController
    from agentrl.trainer.nccl import NCCLWeightSender
    from agentrl.trainer.publish import WeightPublisher
    from agentrl.trainer.trainer import Trainer

    hidden, layers, heads, kv, inter = SIZES[name]
    model = build_tiny_model(
        TinyModelConfig(
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            intermediate_size=inter,
            initializer_range=0.02,
        ),
        cache_dir=cache,
    )
    config = InferenceConfig(
        dtype="float32", enforce_eager=False, kv_cache_mib=4096, weight_transfer="nccl"
    )
    async with await VLLMEngineClient.start(str(model), config) as engine:
        trainer = Trainer(str(model), TrainerConfig(lr=1e-4), temperature=1.0, seed=0)
        trainer.model.to("cuda")
        params = sum(p.numel() for p in trainer.model.parameters())
        controller = RolloutController(EpisodeRunner(engine, trainer.tokenizer))
        sender = NCCLWeightSender.for_engine(trainer.model, engine)
        publisher = WeightPublisher(trainer, controller, sender=sender)
        send_s, pause_s, sent = [], [], 0
        for _ in range(updates):
            with torch.no_grad():
                for p in trainer.model.parameters():
                    p.add_(0.01 * torch.randn_like(p))
            torch.cuda.synchronize()
            stats = await publisher.publish()
            send_s.append(stats.save_s)
            pause_s.append(stats.update.pause_to_resume_s)
            sent = stats.bytes
        prompt = trainer.tokenizer.encode("Write some digits.")
        gen = await engine.generate(prompt, SamplingConfig(max_tokens=8, seed=0), "check")
        ids = torch.tensor([prompt + list(gen.token_ids)], device="cuda")
        with torch.no_grad():
            logits = trainer.model(ids).logits[0, len(prompt) - 1 : -1]
        ours = torch.log_softmax(logits.float(), -1).gather(
            1, torch.tensor(gen.token_ids, device="cuda")[:, None]
        )[:, 0]
        gap = (ours.cpu() - torch.tensor(gen.logprobs)).abs().mean().item()
        sender.close()
    # the first update includes connecting; report the steady state when there is one
    steady = send_s[1:] or send_s
    p50 = statistics.median(steady)
    return {
        "size": name,
        "params": params,
        "bytes": sent,
        "send_ms_p50": p50 * 1000,
        "pause_to_resume_ms_p50": statistics.median(pause_s[1:] or pause_s) * 1000,
        "gb_per_s": sent / p50 / 1e9 if p50 else float("nan"),
        "logprob_gap": gap,
        "updates": updates,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="20m,300m,1b")
    parser.add_argument("--updates", type=int, default=4)
    parser.add_argument("--cache", default=None, help="model cache (default: agentrl's)")
    args = parser.parse_args()

    from agentrl.trainer.nccl import nccl_available

    if not nccl_available():
        print("bench_nccl_sync: skipped, the NCCL weight path needs a CUDA GPU")
        return 0
    from agentrl.cli import quiet_vllm

    quiet_vllm()
    from benchmarks.common import save, table

    cache = Path(args.cache) if args.cache else None
    rows = []
    for name in args.sizes.split(","):
        if name not in SIZES:
            parser.error(f"unknown size {name!r}; known: {', '.join(SIZES)}")
        result = asyncio.run(one_size(name, args.updates, cache))
        print(result, flush=True)
        rows.append(result)
    markdown = table(
        [
            "Model",
            "Parameters",
            "Bytes sent",
            "Send p50 (ms)",
            "Pause-to-resume p50 (ms)",
            "GB/s",
            "Logprob gap",
        ],
        [
            [
                r["size"],
                f"{r['params'] / 1e6:.0f}M",
                f"{r['bytes'] / 2**20:.0f} MiB",
                r["send_ms_p50"],
                r["pause_to_resume_ms_p50"],
                r["gb_per_s"],
                f"{r['logprob_gap']:.1e}",
            ]
            for r in rows
        ],
    )
    print(markdown)
    save("nccl_sync", {"sizes": args.sizes, "updates": args.updates}, rows, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())

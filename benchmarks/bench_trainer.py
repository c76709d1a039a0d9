"""The trainer's step, mode by mode: fp32 padded (as shipped) against the faster paths.

Modes: fp32 padded, bf16 (autocast), and bf16 with packing, the chunked logprob, gradient
checkpointing, activation offload and compiled layers (``trainer.compile``), each measured
in the same run on the same rows.

    python benchmarks/bench_trainer.py                  # CPU: small shape, 16x256, ~1 minute
    python benchmarks/bench_trainer.py --threads 0      # every core (noisy when others run)
    python benchmarks/bench_trainer.py --dry-run --device cuda --shape 1.5b --case 8x16k

On one H200 (no vLLM needed), one mode at a time; the models are built once and cached
under ``$AGENTRL_CACHE/models`` (``~/.cache/agentrl/models`` by default; 2 GB for 0.5b,
6 GB for 1.5b):

    python benchmarks/bench_trainer.py --device cuda --shape 0.5b --case 64x1k
    python benchmarks/bench_trainer.py --device cuda --shape 1.5b --case 8x16k

On an H200 (2026-12-04) the first took 2 minutes for the six modes before compile, fp32 being the
slow one; results in ``benchmarks/results/trainer_cuda_*.json`` (the docs' benchmarks page). Add
``--modes bf16,bf16+packed+chunked+compile+ckpt`` etc. to run a subset,
``--micro-batch-tokens`` for another budget (the result file then says it: ``_mb32768``),
``--steps`` for more timed steps.

Builds a random-weight Qwen2 model of the chosen shape (``0.5b``, ``1.5b``: Qwen2.5's
shapes with tied embeddings; ``small``: hidden 256, 4 layers, vocab 4,096, for a CPU) and
the project's small byte-level tokenizer (the trainer reads only its pad id), and one
step's worth of synthetic multi-turn rows: a prompt, then assistant turns (trained)
alternating with tool and env turns (not trained), lengths varying per row, in groups of
8 with random rewards and behaviour logprobs near the random model's own. Then, for each
mode, a fresh ``Trainer`` from the same weights: one warm-up step (its loss and gradient
norm are the correctness columns, compared with fp32 padded's first step from the same
weights and rows) and ``--steps`` timed steps (median): on a GPU one mode after the
other, on CPU round-robin over all the modes' trainers, so that other work on the
machine slows every mode alike (``--sequential`` for one at a time).

MFU = 6 x P x tokens / step time / peak, where P counts the weights every token goes
through a matmul of (the tied embedding once, as the LM head), tokens are the rows' own
(no padding), and peak is measured in the same run: a large bf16 matmul loop on a GPU,
an fp32 matmul loop on CPU (labelled; bf16 autocast on CPU is measured against it too).
Causal attention FLOPs are not in the 6 x P count; the output says how much they add,
and its "MFU with attention" column counts them.
Peak memory: ``torch.cuda.max_memory_allocated`` per mode, over its construction, warm-up
step and timed steps (weights, gradients, AdamW state and a micro-batch's activations:
AdamW's moments are made at the first optimizer step, after that step's activations are
gone, so the warm-up step alone would miss them; its own peak is kept in the JSON as
``first_step_peak_memory_bytes``); on CPU the growth of the process's resident memory
during the mode's construction and warm-up step, sampled every 5 ms. A mode that runs out
of memory is listed with the trainer's advice. Writes ``results/trainer.json`` on CPU,
``results/trainer_cuda_<shape>_<case>.json`` on a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import save, table
from benchmarks.trainer_meters import MemoryMeter, matmul_peaks, release_memory, synchronize
from benchmarks.trainer_workload import (
    CASES,
    DEFAULT_CASE,
    DEFAULT_SHAPE,
    SHAPES,
    Case,
    Shape,
    build_model,
    matmul_parameters,
    synthetic_groups,
)

PACKED = {"packing": True}
CHUNKED = {"packing": True, "chunked_logprob": True}
MODES: dict[str, dict[str, Any]] = {
    "fp32": {"precision": "fp32", "packing": False, "chunked_logprob": False},
    "bf16": {"precision": "bf16", "packing": False, "chunked_logprob": False},
    "bf16+packed": {"precision": "bf16", **PACKED, "chunked_logprob": False},
    "bf16+packed+chunked": {"precision": "bf16", **CHUNKED},
    "bf16+packed+chunked+ckpt": {"precision": "bf16", **CHUNKED, "gradient_checkpointing": True},
    "bf16+packed+chunked+offload": {"precision": "bf16", **CHUNKED, "activation_offload": True},
    "bf16+packed+chunked+compile": {"precision": "bf16", **CHUNKED, "compile": True},
    "bf16+packed+chunked+compile+ckpt": {
        "precision": "bf16",
        **CHUNKED,
        "compile": True,
        "gradient_checkpointing": True,
    },
}
BASELINE = "fp32"


def start_mode(
    name: str, model: Path, groups: list[Any], args: argparse.Namespace, device: Any
) -> tuple[dict[str, Any], Any]:
    """A fresh trainer in mode ``name`` and its warm-up step, under a memory meter.

    Returns the mode's record and the trainer (None when the mode could not run).
    """
    import torch

    from agentrl.config.sections import TrainerConfig
    from agentrl.errors import ConfigError
    from agentrl.trainer.placement import TrainerMemoryError
    from agentrl.trainer.trainer import Trainer

    config = TrainerConfig(
        device=str(device), micro_batch_tokens=args.micro_batch_tokens, **MODES[name]
    )
    meter = MemoryMeter(device)
    trainer = None
    out: dict[str, Any] = {"mode": name, "step_s": []}
    try:
        trainer = Trainer(str(model), config, temperature=1.0, seed=0)
        out["placement"] = trainer.placement()
        out["attention"] = trainer.attention or "sdpa (padded)"
        batches = trainer.micro_batches(_rows(groups, trainer))
        out["micro_batches"] = len(batches)
        out["model_tokens"] = sum(mb.model_tokens for mb in batches)  # padding included
        del batches
        first, out["warmup_s"] = _timed_step(trainer, groups, device)
        out["loss"], out["grad_norm"] = first.loss, first.grad_norm
        out["trained_tokens"] = first.tokens
    except (TrainerMemoryError, torch.OutOfMemoryError) as e:
        out["error"] = f"out of memory: {e}"
        trainer = None
    except ConfigError as e:
        out["error"] = f"cannot run here: {e}"
        trainer = None
    except RuntimeError as e:  # one mode's failure (a kernel, pinned memory) is a row
        out["error"] = f"failed: {type(e).__name__}: {e}"
        trainer = None
    finally:
        out["peak_memory_bytes"] = meter.stop()
    if trainer is None:
        release_memory(device)
    return out, trainer


def time_step(out: dict[str, Any], trainer: Any, groups: list[Any], device: Any) -> Any:
    """One timed step into ``out``; the trainer, or None once it ran out of memory."""
    import torch

    from agentrl.trainer.placement import TrainerMemoryError

    try:
        out["step_s"].append(_timed_step(trainer, groups, device)[1])
        return trainer
    except (TrainerMemoryError, torch.OutOfMemoryError) as e:
        out["error"] = f"out of memory: {e}"
        return None
    except RuntimeError as e:
        out["error"] = f"failed: {type(e).__name__}: {e}"
        return None


def measure(
    modes: list[str], model: Path, groups: list[Any], args: argparse.Namespace, device: Any
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Every mode's record, and the best matmul peaks seen (before, between and after).

    ``args.sequential`` (the default on a GPU): one mode at a time, each alone in memory,
    so its peak is its own. Otherwise (CPU) all trainers stay alive and the timed steps
    go round-robin, one step of each mode per round, so that a busy machine slows every
    mode alike; memory is then measured over each trainer's construction and warm-up
    step (weights, AdamW state, activations).
    """
    import torch

    _warm_imports()  # so that the first mode's memory is not the imports'
    peaks = [matmul_peaks(device)]
    results, live = [], {}
    for name in modes:
        out, trainer = start_mode(name, model, groups, args, device)
        results.append(out)
        if args.sequential and trainer is not None:
            for _ in range(args.steps):
                if (trainer := time_step(out, trainer, groups, device)) is None:
                    break
            if device.type == "cuda":  # the timed steps hold the AdamW moments too
                out["first_step_peak_memory_bytes"] = out["peak_memory_bytes"]
                out["peak_memory_bytes"] = float(torch.cuda.max_memory_allocated(device))
            del trainer
            release_memory(device)
        elif trainer is not None:
            live[name] = trainer
        _progress(out)
    for _ in range(args.steps if live else 0):
        for out in results:
            if out["mode"] in live and time_step(out, live[out["mode"]], groups, device) is None:
                del live[out["mode"]]
        peaks.append(matmul_peaks(device))
    if live:
        print(
            "  timed, round-robin: "
            + ", ".join(
                f"{o['mode']} {statistics.median(o['step_s']):.3f} s"
                for o in results
                if o["step_s"]
            ),
            flush=True,
        )
    live.clear()
    release_memory(device)
    peaks.append(matmul_peaks(device))
    return results, {k: max(p[k] for p in peaks) for k in peaks[0]}


def _warm_imports() -> None:
    import trl.trainer.utils  # noqa: F401  (the logprob kernels)
    from transformers.integrations import sdpa_attention  # noqa: F401

    from agentrl.trainer import trainer  # noqa: F401


def _progress(out: dict[str, Any]) -> None:
    if "error" in out:
        said = out["error"].split(".")[0]
    elif out["step_s"]:
        said = (
            f"{statistics.median(out['step_s']):.3f} s/step (warm-up step {out['warmup_s']:.1f} s)"
        )
    else:
        said = f"warm-up step {out['warmup_s']:.3f} s"
    print(f"  {out['mode']}: {said}, {out['peak_memory_bytes'] / 2**30:.2f} GiB", flush=True)


def _rows(groups: list[Any], trainer: Any) -> list[Any]:
    from agentrl.trainer.batch import rows_from_groups

    return rows_from_groups(groups, trainer.config.scale_rewards, trainer.config.loss)


def _timed_step(trainer: Any, groups: list[Any], device: Any) -> tuple[Any, float]:
    synchronize(device)
    t0 = time.perf_counter()
    stats = trainer.train_step(groups)
    synchronize(device)
    return stats, time.perf_counter() - t0


# ---------------------------------------------------------------- report


@dataclasses.dataclass(frozen=True, slots=True)
class Setup:
    """What every mode of one run shares."""

    device: Any
    device_text: str
    shape: str
    case: str
    parameters: int
    matmul_parameters: int
    tokens: int
    attention_share: float
    """Causal attention FLOPs (fwd + bwd) as a fraction of the 6 x P x tokens count."""


def describe(setup: Setup, case: Case, groups: list[Any]) -> str:
    lengths = [len(t) for g in groups for t in g.trajectories]
    trained = sum(t.num_sampled for g in groups for t in g.trajectories)
    turns = [sum(s.kind == "assistant" for s in t.spans) for g in groups for t in g.trajectories]
    return (
        f"{len(lengths)} rows of {min(lengths):,}-{max(lengths):,} tokens "
        f"({setup.tokens:,} in all, {trained / setup.tokens:.0%} trained; "
        f"{min(turns)}-{max(turns)} assistant turns per row), micro-batches of "
        f"<= {case.micro_batch_tokens:,} tokens"
    )


def mfu_peak(setup: Setup, peaks: dict[str, float]) -> tuple[float, str]:
    """The peak the MFU divides by, and its label."""
    if setup.device.type == "cuda":
        return peaks["bf16"], "bf16 matmul peak measured here"
    return peaks["fp32"], "fp32 matmul peak on this CPU, measured here"


def report(
    setup: Setup,
    results: list[dict[str, Any]],
    peaks: dict[str, float],
    args: argparse.Namespace,
    rows_text: str,
) -> str:
    import torch
    import transformers

    base = next((r for r in results if r["mode"] == BASELINE and "error" not in r), None)
    gpu = setup.device.type == "cuda"
    peak, label = mfu_peak(setup, peaks)
    memory_head = "peak memory (GiB)" if gpu else "peak RSS growth (GiB)"
    rows = [_row(r, setup, peak, base) for r in results]
    schedule = "one mode at a time" if args.sequential else "round-robin, all trainers alive"
    notes = "".join(f"\n\n{r['mode']}: {r['error']}" for r in results if "error" in r)
    if not gpu:
        notes += (
            f"\n\nOn CPU: bf16 autocast runs its matmuls at this CPU's bf16 rate "
            f"({peaks['bf16'] / 1e12:,.2f} TFLOP/s measured here, where it has AMX or "
            f"AVX-512 BF16; far slower where it has neither), yet the MFU divides by "
            f"the fp32 peak; packed attention is SDPA once per row (no varlen "
            f"kernel). These say how the paths run here, not on a GPU."
        )
    return (
        f"### Trainer step by mode: {setup.shape} "
        f"({setup.parameters / 1e6:,.1f}M parameters) on {setup.device_text}, "
        f"case {setup.case}\n\n"
        f"{rows_text}; a fresh trainer per mode, one warm-up step, then the median of "
        f"{args.steps} ({schedule}). "
        f"torch {torch.__version__}, transformers {transformers.__version__}. "
        f"Peak: {peak / 1e12:,.2f} TFLOP/s, the {label}.\n\n"
        + table(
            [
                "mode",
                "attention",
                "micro-batches",
                "s/step",
                "tokens/s",
                f"x {BASELINE}",
                "MFU",
                "MFU with attention",
                memory_head,
                "step-1 loss",
                f"loss - {BASELINE}'s",
                f"grad norm / {BASELINE}'s",
            ],
            rows,
        )
        + f"\n\nMFU = 6 x {setup.matmul_parameters / 1e6:,.1f}M x tokens / step time / peak; "
        f"causal attention adds {setup.attention_share:.0%} to those FLOPs at these "
        f"lengths (the 'with attention' column counts them too, as PaLM's MFU does). "
        f"The loss and grad-norm columns compare each mode's first step with {BASELINE} "
        f"padded's, from the same weights and rows.{notes}"
    )


def _row(r: dict[str, Any], setup: Setup, peak: float, base: dict[str, Any] | None) -> list[Any]:
    gib = f"{r['peak_memory_bytes'] / 2**30:.2f}"
    if "error" in r:
        return [
            r["mode"],
            r.get("attention", ""),
            r.get("micro_batches", ""),
            r["error"].split(":")[0],
            "",
            "",
            "",
            "",
            gib,
            "",
            "",
            "",
        ]
    step = statistics.median(r["step_s"])
    rate = setup.tokens / step
    mfu = 6 * setup.matmul_parameters * setup.tokens / step / peak
    ratio = loss_diff = norm_ratio = "n/a"
    if base is not None:
        ratio = f"{rate / (setup.tokens / statistics.median(base['step_s'])):.2f}"
        loss_diff = f"{r['loss'] - base['loss']:+.2e}"
        norm_ratio = f"{r['grad_norm'] / base['grad_norm']:.4f}"
    return [
        r["mode"],
        r["attention"],
        r["micro_batches"],
        f"{step:.3f}",
        f"{rate:,.0f}",
        ratio,
        f"{mfu:.1%}",
        f"{mfu * (1 + setup.attention_share):.1%}",
        gib,
        f"{r['loss']:.5f}",
        loss_diff,
        norm_ratio,
    ]


# ---------------------------------------------------------------- setup and checks


def attention_share(shape: Shape, groups: list[Any], parameters: int) -> float:
    """Causal attention FLOPs (QK^T and AV, fwd + bwd: 6 n^2 d per layer) / (6 P n)."""
    lengths = np.array([len(t) for g in groups for t in g.trajectories], dtype=np.float64)
    return float((lengths**2).sum() * shape.hidden * shape.layers / (parameters * lengths.sum()))


def check_fit(shape_name: str, parameters: int, case: Case, device: Any) -> None:
    """Stop before building anything that cannot fit, naming what to try instead."""
    static = 16 * parameters  # fp32 weights, gradients and two AdamW moments
    if device.type == "cpu" and shape_name != "small":
        sys.exit(
            f"--shape {shape_name} is for a GPU (a CPU step would take many minutes "
            f"and {static / 2**30:.0f} GiB before activations); use --shape small on "
            f"CPU, or add --dry-run to check the {shape_name} setup here"
        )
    if device.type == "cuda":
        import torch

        total = torch.cuda.get_device_properties(device).total_memory
        if static > 0.9 * total:
            smaller = "--shape 0.5b" if shape_name == "1.5b" else "--shape small"
            sys.exit(
                f"--shape {shape_name} needs {static / 2**30:.1f} GiB for fp32 weights, "
                f"gradients and AdamW state alone; {device} has {total / 2**30:.1f} GiB. "
                f"Try {smaller}, or a GPU with more memory"
            )
    longest = case.mean_tokens * (1 + case.spread)
    if longest > 32768:
        sys.exit(
            f"case rows reach {longest:,.0f} tokens, past the model's 32,768 positions; "
            f"use one of {', '.join(CASES)}"
        )


def dry_run(setup: Setup, case: Case, groups: list[Any], modes: list[str], rows_text: str) -> None:
    """The plan without a model: settings, micro-batches and tokens per mode."""
    from agentrl.config.sections import TrainerConfig
    from agentrl.trainer.batch import micro_batches, packed_micro_batches, rows_from_groups

    rows = rows_from_groups(groups)
    plans = []
    for name in modes:
        config = TrainerConfig(
            device=str(setup.device), micro_batch_tokens=case.micro_batch_tokens, **MODES[name]
        )
        split = packed_micro_batches if config.packing else micro_batches
        batches = split(rows, case.micro_batch_tokens)
        model_tokens = sum(mb.model_tokens for mb in batches)
        plans.append(
            [
                name,
                config.precision,
                len(batches),
                f"{model_tokens:,}",
                f"{1 - setup.tokens / model_tokens:.1%}",
            ]
        )
    static = 16 * setup.parameters / 2**30
    print(
        f"dry run: {setup.shape} ({setup.parameters / 1e6:,.1f}M parameters, "
        f"{static:.1f} GiB of fp32 weights, gradients and AdamW state) on "
        f"{setup.device_text}, case {setup.case}: {rows_text}\n"
    )
    print(table(["mode", "precision", "micro-batches", "model tokens", "padding"], plans))
    print(
        f"\ncausal attention adds {setup.attention_share:.0%} to the 6 x P FLOPs; "
        f"nothing was built or run"
    )


def parse(argv: list[str] | None) -> argparse.Namespace:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cpu, cuda or cuda:N (default: cuda when there is one)",
    )
    parser.add_argument(
        "--shape", choices=list(SHAPES), help="model shape (default: 0.5b on a GPU, small on CPU)"
    )
    parser.add_argument(
        "--case",
        choices=list(CASES),
        help="rows x tokens per step (default: 64x1k on a GPU, 16x256 on CPU)",
    )
    parser.add_argument("--steps", type=int, default=3, help="timed steps per mode")
    parser.add_argument(
        "--threads",
        type=int,
        help="CPU: torch threads for the steps and the peaks (default: trainer.torch_threads' "
        "default, 1, as agentrl train's CPU trainer; 0: torch's own, one per core)",
    )
    parser.add_argument(
        "--modes", default=",".join(MODES), help=f"comma-separated, of: {', '.join(MODES)}"
    )
    parser.add_argument(
        "--micro-batch-tokens", type=int, help="trainer.micro_batch_tokens (default: the case's)"
    )
    parser.add_argument(
        "--sequential",
        action="store_true",
        help="one mode at a time, each alone in memory (the default on a GPU; on CPU the "
        "timed steps go round-robin over all modes)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="build the rows and plan the micro-batches; no model, no steps",
    )
    args = parser.parse_args(argv)
    kind = torch.device(args.device).type
    args.sequential = args.sequential or kind == "cuda"
    args.shape = args.shape or DEFAULT_SHAPE[kind]
    args.case = args.case or DEFAULT_CASE[kind]
    args.micro_batch_tokens = args.micro_batch_tokens or CASES[args.case].micro_batch_tokens
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in args.modes if m not in MODES]
    if unknown or args.steps < 1:
        parser.error(
            f"--modes {unknown} unknown; use some of {', '.join(MODES)}"
            if unknown
            else f"--steps {args.steps}: at least 1"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    import torch
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # the tables are the output
    args = parse(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        from agentrl.config.sections import TrainerConfig

        threads = TrainerConfig().torch_threads if args.threads is None else args.threads
        if threads:  # 0 or unset: torch's own
            torch.set_num_threads(threads)
        args.threads = torch.get_num_threads()
    if device.type == "cuda" and not args.dry_run and not torch.cuda.is_available():
        sys.exit(
            f"--device {args.device}: torch {torch.__version__} sees no GPU; "
            f"use --device cpu, or --dry-run to check the setup"
        )
    shape, case = (
        SHAPES[args.shape],
        dataclasses.replace(CASES[args.case], micro_batch_tokens=args.micro_batch_tokens),
    )
    total, matmul = matmul_parameters(shape)
    groups = synthetic_groups(case, shape.vocab)
    tokens = sum(len(t) for g in groups for t in g.trajectories)
    described = device.type == "cuda" and torch.cuda.is_available()
    text = torch.cuda.get_device_name(device) if described else str(device)
    if device.type == "cpu":
        threads = torch.get_num_threads()
        text = (
            f"cpu ({len(os.sched_getaffinity(0))} cores, {threads} torch "
            f"thread{'s' if threads != 1 else ''})"
        )
    setup = Setup(
        device,
        text,
        args.shape,
        args.case,
        total,
        matmul,
        tokens,
        attention_share(shape, groups, matmul),
    )
    rows_text = describe(setup, case, groups)
    if args.dry_run:
        dry_run(setup, case, groups, args.modes, rows_text)
        return 0
    check_fit(args.shape, total, case, device)
    started = time.perf_counter()
    model = build_model(args.shape, shape, args.device)
    print(f"  model {model.name} ready in {time.perf_counter() - started:.0f} s", flush=True)
    results, peaks = measure(args.modes, model, groups, args, device)
    markdown = report(setup, results, peaks, args, rows_text)
    print(markdown, flush=True)
    result_name = "trainer" if device.type == "cpu" else f"trainer_cuda_{args.shape}_{args.case}"
    if device.type != "cpu" and case.micro_batch_tokens != CASES[args.case].micro_batch_tokens:
        result_name += f"_mb{case.micro_batch_tokens}"  # another budget: its own file
    settings = {
        **vars(args),
        "device_name": text,
        "case_settings": dataclasses.asdict(case),
        "shape_settings": dataclasses.asdict(shape),
    }
    save(
        result_name,
        settings,
        {
            "parameters": total,
            "matmul_parameters": matmul,
            "tokens": tokens,
            "peak_flops": mfu_peak(setup, peaks)[0],
            "peak": mfu_peak(setup, peaks)[1],
            "matmul_peaks_flops": peaks,
            "attention_share": setup.attention_share,
            "modes": results,
        },
        markdown,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Warm-start a model on demonstrations with TRL's ``SFTTrainer`` before RL.

A demonstration is a whole episode as chat messages: the env's system prompt and first
observation, then assistant turns (text, tool calls written as the model would write
them), tool results and env replies. :func:`demonstration_example` tokenizes it
exactly as the rollout engine will see it in RL (the same :class:`Conversation`, the
same tool schemas and template deltas), and marks only the assistant's tokens for the
loss. :func:`warm_start` trains on such examples and saves a model folder that vLLM and
the trainer load.

In: a model path, demonstrations. Out: the path of the fine-tuned model folder.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from agentrl.chat.conversation import Conversation
from agentrl.errors import ConfigError
from agentrl.types import Message

logger = logging.getLogger(__name__)


def demonstration_example(
    tokenizer: Any, messages: Sequence[Message], tools: list[dict[str, Any]] | None = None
) -> dict[str, list[int]]:
    """Token ids and assistant mask of one demonstrated episode.

    Args:
        tokenizer: the model's tokenizer (with its chat template).
        messages: system (optional), the first user message, then alternating assistant
            turns and user/tool replies. Assistant content is the raw text the model
            should produce, tool calls included.
        tools: the tool schemas the env declares (``ToolSet(env.tools).schemas``).

    Returns:
        ``{"input_ids": [...], "assistant_masks": [...]}`` (1 on assistant tokens and
        their end-of-turn token), the pre-tokenized format ``SFTTrainer`` accepts.
    """
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if first is None:
        raise ValueError("a demonstration needs at least one assistant turn")
    conversation = Conversation(tokenizer, list(messages[:first]), tools=tools)
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if not isinstance(end_of_turn, int) or end_of_turn < 0:
        end_of_turn = tokenizer.eos_token_id
    i = first
    while i < len(messages):
        message = messages[i]
        if message["role"] == "assistant":
            text = str(message.get("content") or "")
            ids = [*tokenizer.encode(text, add_special_tokens=False), end_of_turn]
            conversation.add_sampled(ids, [0.0] * len(ids), [0] * len(ids))
            conversation.end_assistant_turn(text, "stop")
            i += 1
        else:
            j = i
            while j < len(messages) and messages[j]["role"] != "assistant":
                j += 1
            kind = "tool" if message["role"] == "tool" else "env"
            if not conversation.add_messages(list(messages[i:j]), kind):  # type: ignore[arg-type]
                raise ValueError("the demonstration does not fit the model's context")
            i = j
    if conversation.segments_started:
        raise ValueError(
            "the chat template rewrites earlier turns; demonstrations need a "
            "prefix-preserving template"
        )
    segment = conversation.current
    return {"input_ids": list(segment.token_ids), "assistant_masks": list(segment.loss_mask)}


@dataclasses.dataclass(frozen=True)
class SFTSettings:
    """One SFT stage (``SFTConfig`` fields that matter for a warm start)."""

    steps: int = 500
    batch_size: int = 64
    lr: float = 1e-3
    warmup_ratio: float = 0.05
    scheduler: str = "cosine"
    weight_decay: float = 0.0
    seed: int = 0
    threads: int | None = None
    """torch threads (default: all cores)."""

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"sft.{name} must be at least 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ConfigError(f"sft.lr must be positive, got {self.lr}")


def scaled_stage(settings: SFTSettings, count: int, scale: float) -> tuple[SFTSettings, int]:
    """A stage's settings and number of demonstrations with both times ``scale`` (a
    quick check of a recipe), keeping at least one step and one batch."""
    if scale == 1.0:
        return settings, count
    steps = max(1, round(settings.steps * scale))
    count = max(settings.batch_size, round(count * scale))
    return dataclasses.replace(settings, steps=steps), count


def cached_warm_start(name: str, recipe: object, model_key: str, fresh: bool) -> tuple[Path, bool]:
    """Where the warm start ``name`` of a model with a recipe is kept, and whether a
    finished one is there to reuse.

    The folder is ``<cache>/warm-start/<name>-<hash>``, hashed over ``repr(recipe)``
    and ``model_key``: a changed recipe or base model gets a folder of its own.
    ``fresh`` removes what is there, so it is built again.
    """
    import hashlib
    import json

    from agentrl.models.tiny import default_cache_dir

    payload = json.dumps({"model": model_key, "recipe": repr(recipe)}, sort_keys=True)
    digest = hashlib.sha256(payload.encode()).hexdigest()[:12]
    out = default_cache_dir().parent / "warm-start" / f"{name}-{digest}"
    if fresh and out.exists():
        shutil.rmtree(out)
    return out, (out / "config.json").is_file()


def _staging_folder(out: Path) -> Path:
    """The scratch folder next to ``out`` that a warm start builds in, emptied.

    Raises:
        ConfigError: ``out`` already holds a model.
    """
    if (out / "config.json").is_file():
        raise ConfigError(f"{out} already holds a model; remove it or choose another folder")
    staging = out.with_name(f".{out.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    return staging


def _progress_callback(stage: int, total: int, say: Callable[[str], None]) -> Any:
    """A ``TrainerCallback`` that reports loss, speed and ETA through ``say`` on each log."""
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        def __init__(self, stage: int, total: int) -> None:
            self.stage, self.total, self.started = stage, total, time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                rate = state.global_step / max(time.perf_counter() - self.started, 1e-9)
                eta = (self.total - state.global_step) / max(rate, 1e-9)
                say(
                    f"sft stage {self.stage}: step {state.global_step}/{self.total}  "
                    f"loss {logs['loss']:.4f}  {rate:.1f} steps/s  eta {eta:.0f} s"
                )

    return Progress(stage, total)


def _sft_config(settings: SFTSettings, output_dir: Path, *, use_cpu: bool) -> Any:
    """TRL's ``SFTConfig`` for one stage: no checkpoints, no reports, ten log lines."""
    from trl import SFTConfig

    return SFTConfig(
        output_dir=str(output_dir),
        max_steps=settings.steps,
        per_device_train_batch_size=settings.batch_size,
        learning_rate=settings.lr,
        lr_scheduler_type=settings.scheduler,
        warmup_steps=math.ceil(settings.warmup_ratio * settings.steps),
        weight_decay=settings.weight_decay,
        seed=settings.seed,
        logging_steps=max(1, settings.steps // 10),
        save_strategy="no",
        report_to=[],
        use_cpu=use_cpu,
        bf16=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
        max_length=None,
    )


def _train_stage(
    model: Any,
    tokenizer: Any,
    number: int,
    settings: SFTSettings,
    examples: Iterable[dict[str, list[int]]],
    staging: Path,
    say: Callable[[str], None],
) -> Any:
    """Run stage ``number`` (one ``SFTTrainer`` run) on ``model``; return the trained model."""
    import torch
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTTrainer

    rows = list(examples)
    if not rows:
        raise ConfigError(f"sft stage {number} has no examples")
    if settings.threads:
        torch.set_num_threads(settings.threads)
    config = _sft_config(
        settings, staging / f"stage{number}", use_cpu=not torch.cuda.is_available()
    )
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[_progress_callback(number, settings.steps, say)],
    )
    trainer.remove_callback(PrinterCallback)  # Progress prints one line per log
    trainer.train()
    return trainer.model


def _publish(model: Any, tokenizer: Any, model_path: str | Path, staging: Path, out: Path) -> None:
    """Save ``model`` and ``tokenizer`` under ``staging`` and move the folder to ``out``.

    Files of ``model_path`` that saving does not write (``generation_config.json``) are
    copied along; the final rename makes ``out`` appear complete or not at all.
    """
    model.save_pretrained(staging / "model")
    tokenizer.save_pretrained(staging / "model")
    for name in ("generation_config.json",):
        source = Path(model_path) / name
        if source.is_file() and not (staging / "model" / name).exists():
            shutil.copy(source, staging / "model" / name)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(staging / "model", out)


def warm_start(
    model_path: str | Path,
    stages: Sequence[tuple[SFTSettings, Iterable[dict[str, list[int]]]]],
    out_dir: str | Path,
    *,
    on_log: Callable[[str], None] | None = None,
) -> Path:
    """Fine-tune ``model_path`` on pre-tokenized examples, stage after stage.

    Each stage is one ``SFTTrainer`` run (its own learning-rate schedule) starting from
    the previous stage's weights. The result is written to ``out_dir`` (tokenizer
    included) atomically: a folder that holds ``config.json`` is complete.
    """
    import datasets
    import torch
    import trl  # noqa: F401  (fail on a missing TRL before loading the model)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    datasets.disable_progress_bars()

    out = Path(out_dir)
    staging = _staging_folder(out)
    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    say = on_log or (lambda line: logger.info("%s", line))
    threads = torch.get_num_threads()
    try:
        for number, (settings, examples) in enumerate(stages, 1):
            model = _train_stage(model, tokenizer, number, settings, examples, staging, say)
        torch.set_num_threads(threads)
        _publish(model, tokenizer, model_path, staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out

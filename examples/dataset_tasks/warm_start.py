"""A warm start for the word problems: the calculator demo's warm-started model, then a
short SFT on demonstrations written from the train split's rows.

The calculator demo's model knows the tool format and ``Answer: N`` but has only seen
"What is a + b?": on the word problems it scores about 0 (pass@1 0.005 measured), so RL
has nothing to reinforce. Here, as in that demo, a *tool* demonstration calls the
calculator with the row's two numbers and the operation its answer implies, a *guess*
demonstration answers at once with an estimate; 40 % use the tool, so RL has to find
that the tool pays (first a stage where every demonstration does, which teaches copying
the question's numbers). Only train rows are used (make_data keeps the test split's
questions out of it). Cached like the calculator's warm start.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from agentrl.sft import SFTSettings  # noqa: E402

STAGES = (
    # Copying the question's numbers into the call first: every demonstration uses the
    # tool (150 steps at 1e-3 did not learn it: loss 0.29, calls with other numbers).
    (SFTSettings(steps=250, batch_size=16, lr=2e-3, scheduler="constant_with_warmup"), 4000, 1.0),
    # Then the mix that sets how often the model reaches for the tool.
    (SFTSettings(steps=100, batch_size=16, lr=1e-3, scheduler="cosine"), 1600, 0.4),
)


def demonstration(row: dict, system_prompt: str, use_tool: bool) -> list[dict]:
    """One episode of a train row as chat messages (tool call or guess)."""
    from examples.calculator_agent.demonstrations import estimate, tool_call_text

    a, b = (int(n) for n in re.findall(r"\d+", row["question"])[:2])
    answer = int(row["answer"])
    messages = [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": row["question"]},
    ]
    if not use_tool:
        return [*messages, {"role": "assistant", "content": f"Answer: {estimate(answer)}"}]
    expression = f"{a}+{b}" if a + b == answer else f"{a}-{b}"
    return [
        *messages,
        {"role": "assistant", "content": tool_call_text(expression)},
        {"role": "tool", "name": "calculator", "content": str(answer)},
        {"role": "assistant", "content": f"Answer: {answer}"},
    ]


def warm_start(base: Path, data: Path, system_prompt: str) -> Path:
    """The word-problem warm start of ``base`` on ``data``'s train split (built once)."""
    from agentrl.models.tiny import default_cache_dir
    from agentrl.sft import demonstration_example
    from agentrl.sft import warm_start as sft
    from agentrl.tools import ToolSet
    from tools.calculator import calculator

    rows = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()]
    recipe = repr((STAGES, system_prompt, str(base), rows))
    key = hashlib.sha256(recipe.encode()).hexdigest()[:12]
    out = default_cache_dir().parent / "warm-start" / f"word-problems-{key}"
    if (out / "config.json").is_file():
        print(f"warm start: reusing {out}", flush=True)
        return out
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(base))
    schemas = ToolSet([calculator]).schemas
    stages, offset = [], 0
    for settings, count, tool_fraction in STAGES:
        uses = [(i % 10) < tool_fraction * 10 for i in range(count)]
        demos = [
            demonstration(rows[(offset + i) % len(rows)], system_prompt, use)
            for i, use in enumerate(uses)
        ]
        offset += count
        stages.append((settings, [demonstration_example(tokenizer, d, schemas) for d in demos]))
    total = sum(s.steps for s, _, _ in STAGES)
    print(
        f"warm start: SFT of {base} on {offset} word-problem demonstrations, {total} steps "
        f"(TRL SFTTrainer)",
        flush=True,
    )
    started = time.perf_counter()
    sft(str(base), stages, out, on_log=lambda line: print(f"  {line}", flush=True))
    print(f"warm start: done in {time.perf_counter() - started:.0f} s -> {out}", flush=True)
    return out

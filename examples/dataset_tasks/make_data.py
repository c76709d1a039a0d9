"""Arithmetic word problems as JSONL: ``train.jsonl`` and ``test.jsonl`` in a folder.

    python examples/dataset_tasks/make_data.py [OUT_DIR]     # default: data/ beside this file

Each row: ``question`` (the prompt), ``answer`` (an int). The two splits hold different
problems (seeded; no test question appears in train), so ``split = "test"`` is held out.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

TEMPLATES = (
    "Ann has {a} apples and buys {b} more. How many apples does she have?",
    "A shelf holds {a} books; {b} more are added. How many books are on it?",
    "Tom had {a} coins and found {b}. How many coins does he have now?",
    "A box has {a} pens. Someone puts in {b} pens. How many pens are in the box?",
    "There were {a} birds on a tree and {b} flew away. How many are left?",
)


def problem(rng: random.Random) -> dict[str, object]:
    template = rng.choice(TEMPLATES)
    a, b = rng.randint(10, 49), rng.randint(1, 9)
    answer = a - b if "left" in template else a + b
    return {"question": template.format(a=a, b=b), "answer": answer}


def write(out: Path, train: int = 1000, test: int = 200) -> Path:
    """Write ``train.jsonl`` and ``test.jsonl`` under ``out``; return ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(1)
    held_out = [problem(rng) for _ in range(test)]
    questions = {row["question"] for row in held_out}
    rng, rows = random.Random(0), []
    while len(rows) < train:  # the test split's questions never appear in train
        row = problem(rng)
        if row["question"] not in questions:
            rows.append(row)
    for name, split in (("train", rows), ("test", held_out)):
        with (out / f"{name}.jsonl").open("w") as f:
            for row in split:
                f.write(json.dumps(row) + "\n")
    return out


if __name__ == "__main__":
    print(write(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "data"))

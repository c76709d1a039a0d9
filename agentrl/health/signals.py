"""The step metrics the health rules need that the trainer does not compute.

:func:`step_signals` reads the groups a step trained (their token arrays, spans,
messages and rewards: nothing is decoded or re-tokenized) and returns a few numbers for
the step's row of ``metrics.jsonl``:

* ``entropy``: mean of ``-logprob`` over the sampled tokens: the sampled-token entropy
  estimate (the expected ``-log p(x)`` for ``x ~ p`` is the entropy of ``p``);
* ``response_tokens``: sampled tokens per episode; ``turns_mean`` and
  ``single_turn_share``: assistant turns per episode;
* ``truncated_share``; ``env_success_rate`` (the env's ``info["success"]``, nan when the
  env reports none); ``tool_results``: tool results rendered in the step's episodes;
* ``zero_variance_share``: groups whose episodes all got one reward;
* ``repeated_completion_share``: groups where most episodes wrote the same text;
  ``ngram_repeat_share``: assistant turns that loop on one n-gram (:func:`loops`).

Their cost per step is measured in ``benchmarks/bench_health.py``.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from agentrl.types import Group, Trajectory

NGRAM = 4
"""A turn loops when one run of this many tokens..."""
MIN_REPEATS = 4
"""...occurs at least this many times..."""
MIN_COVER = 0.3
"""...and its repeats cover at least this share of the turn's tokens."""


def loops(tokens: np.ndarray) -> bool:
    """Whether ``tokens`` (one assistant turn) loops on one repeated n-gram."""
    n = len(tokens)
    if n < NGRAM * MIN_REPEATS:
        return False
    if n <= 256:  # a short turn: counting tuples beats numpy's fixed costs (4x at 30 tokens)
        ids = tokens.tolist()
        grams = zip(*(ids[k:] for k in range(NGRAM)), strict=False)  # the shortest ends it
        top = max(collections.Counter(grams).values())
    else:
        t = tokens.astype(np.int64)
        keys = t[: n - NGRAM + 1].copy()
        for k in range(1, NGRAM):  # one integer per n-gram; collisions only over-count, rarely
            keys = keys * 1_000_003 + t[k : n - NGRAM + 1 + k]
        top = int(np.unique(keys, return_counts=True)[1].max())
    return top >= MIN_REPEATS and top * NGRAM >= MIN_COVER * n


def assistant_turns(t: Trajectory) -> list[np.ndarray]:
    """The token ids of each assistant span of ``t``."""
    return [t.token_ids[s.start : s.end] for s in t.spans if s.kind == "assistant"]


def completion_text(t: Trajectory) -> str:
    """Everything the model wrote in an episode (its assistant messages), as one string."""
    parts = []
    for m in t.messages:
        if m.get("role") == "assistant":
            parts.append(f"{m.get('content') or ''}\x00{m.get('tool_calls') or ''}")
    return "\x01".join(parts)


def episodes_of(trajectories: Sequence[Trajectory]) -> list[list[Trajectory]]:
    """The trajectories grouped by episode, segments in order."""
    by_id: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        by_id.setdefault(t.episode_id, []).append(t)
    return [sorted(segs, key=lambda t: t.segment) for segs in by_id.values()]


def step_signals(groups: Sequence[Group]) -> dict[str, float]:
    """The health metrics of one step's groups (see the module docstring)."""
    lp_sum, lp_n = 0.0, 0
    sampled, turns, truncated, tool_results = [], [], 0, 0
    successes: list[float] = []
    looping = all_turns = 0
    for group in groups:
        for segments in episodes_of(group.trajectories):
            final = segments[-1]
            n_sampled, turn_ids = 0, set()
            for t in segments:
                mask = t.loss_mask.astype(bool)
                lp = t.logprobs[mask]
                lp = lp[np.isfinite(lp)]
                lp_sum -= float(lp.sum())
                lp_n += len(lp)
                for span in t.spans:
                    if span.kind == "assistant":
                        n_sampled += span.end - span.start
                        turn_ids.add(span.turn)
                        all_turns += 1
                        looping += loops(t.token_ids[span.start : span.end])
            sampled.append(n_sampled)
            turns.append(len(turn_ids))
            truncated += final.status == "truncated"
            tool_results += sum(m.get("role") == "tool" for m in final.messages)
            success = final.info.get("success")
            if isinstance(success, bool):
                successes.append(float(success))
    n = len(sampled)
    return {
        "entropy": lp_sum / lp_n if lp_n else math.nan,
        "response_tokens": _mean(sampled),
        "turns_mean": _mean(turns),
        "single_turn_share": _mean([x <= 1 for x in turns]),
        "truncated_share": truncated / n if n else math.nan,
        "env_success_rate": _mean(successes),
        "tool_results": float(tool_results),
        "zero_variance_share": _zero_variance_share(groups),
        "repeated_completion_share": _repeated_share(groups),
        "ngram_repeat_share": looping / all_turns if all_turns else math.nan,
    }


def _zero_variance_share(groups: Sequence[Group]) -> float:
    sized = [g.rewards for g in groups]
    sized = [r for r in sized if len(r) > 1]
    if not sized:
        return math.nan
    return sum(max(r) - min(r) < 1e-9 for r in sized) / len(sized)


def _repeated_share(groups: Sequence[Group]) -> float:
    """Share of groups (of 2 or more) in which more than half the episodes wrote the same."""
    shares = []
    for g in groups:
        texts = [completion_text(e[-1]) for e in episodes_of(g.trajectories)]
        if len(texts) > 1:
            top = collections.Counter(texts).most_common(1)[0][1]
            shares.append(top > len(texts) / 2)
    return _mean(shares)


def _mean(values: Sequence[Any]) -> float:
    return sum(float(v) for v in values) / len(values) if values else math.nan

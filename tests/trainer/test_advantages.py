"""Per-turn credit: discounted turn returns and GiGPO step groups, by hand, and how the
advantages reach the tokens of each turn through rows and micro-batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentrl.config import LossConfig
from agentrl.errors import ConfigError
from agentrl.trainer.advantages import (
    EpisodeTurns,
    discounted_returns,
    episode_turns,
    token_advantages,
    turn_advantages,
)
from agentrl.trainer.batch import micro_batches, rows_from_groups
from agentrl.trainer.losses import group_advantages
from agentrl.types import Group, Task, TokenSpan, Trajectory

ROLE = {"prompt": "user", "assistant": "assistant", "env": "user", "tool": "tool"}


def episode(
    eid: str,
    pieces: list[tuple[str, str]],
    turn_rewards: list[float],
    *,
    segment: int = 0,
    status: str = "finished",
) -> Trajectory:
    """A trajectory from (kind, text) pieces: one token per character, turns numbered as
    the conversation numbers them (an env reply after turn k belongs to turn k + 1)."""
    ids: list[int] = []
    mask: list[int] = []
    spans, messages = [], []
    turn = 0
    for kind, text in pieces:
        start = len(ids)
        ids += [ord(c) for c in text]
        mask += [int(kind == "assistant")] * len(text)
        spans.append(TokenSpan(kind, start, len(ids), turn))  # type: ignore[arg-type]
        messages.append({"role": ROLE[kind], "content": text})
        turn += kind == "assistant"
    m = np.array(mask)
    return Trajectory(
        episode_id=eid,
        task_id="t",
        env_id="e",
        seed=0,
        token_ids=ids,
        logprobs=np.where(m == 1, -1.0, np.nan),
        versions=np.where(m == 1, 0, -1),
        loss_mask=m,
        spans=tuple(spans),
        messages=messages,
        turn_rewards=turn_rewards,
        reward=float(sum(turn_rewards)),
        status=status,
        segment=segment,  # type: ignore[arg-type]
    )


def test_discounted_returns() -> None:
    assert discounted_returns([0.0, 0.0, 1.0], 0.5) == [0.25, 0.5, 1.0]
    assert discounted_returns([1.0, 0.0, 2.0], 1.0) == [3.0, 2.0, 2.0]
    assert discounted_returns([], 0.9) == []


def test_turn_return_by_hand() -> None:
    a = EpisodeTurns(0, 1.0, (0.0, 1.0), ("a0", "a1"))  # returns (gamma 0.5): 0.5, 1
    b = EpisodeTurns(0, 0.0, (0.0, 0.0, 0.0), ("b0", "b1", "b2"))  # 0, 0, 0
    c = EpisodeTurns(1, 2.0, (2.0,), ("c0",))  # alone in its group
    # one pool per group: [0.5, 1, 0, 0, 0], mean 0.3
    out = turn_advantages([a, b, c], "turn_return", "none", gamma=0.5, step_weight=1.0)
    assert np.allclose(out[0], [0.2, 0.7]) and np.allclose(out[1], [-0.3] * 3)
    assert out[2] == (0.0,)
    std = 0.2**0.5  # unbiased: (0.04 + 0.49 + 3 * 0.09) / 4
    scaled = turn_advantages([a, b, c], "turn_return", "group", gamma=0.5, step_weight=1.0)
    assert np.allclose(scaled[0], [0.2 / (std + 1e-4), 0.7 / (std + 1e-4)], atol=1e-6)


def test_gigpo_by_hand() -> None:
    # group 0: three episodes; every first turn saw the prompt ("k0"), later turns differ
    a = EpisodeTurns(0, 1.0, (0.0, 1.0), ("k0", "kx"))
    b = EpisodeTurns(0, 0.0, (0.0, 0.0), ("k0", "ky"))
    c = EpisodeTurns(0, 0.5, (0.5,), ("k0",))
    d = EpisodeTurns(1, 3.0, (3.0,), ("k0",))  # another group: same key, other step group
    out = turn_advantages([a, b, c, d], "gigpo", "none", gamma=0.5, step_weight=0.5)
    # episode level: rewards 1, 0, 0.5 -> 0.5, -0.5, 0; d alone -> 0
    # returns: a (0.5, 1), b (0, 0), c (0.5); step group k0 of group 0: 0.5, 0, 0.5,
    # mean 1/3 -> 1/6, -1/3, 1/6; kx and ky hold one turn each -> 0
    assert np.allclose(out[0], [0.5 + 0.5 / 6, 0.5])
    assert np.allclose(out[1], [-0.5 - 0.5 / 3, -0.5])
    assert np.allclose(out[2], [0.5 / 6])
    assert np.allclose(out[3], [0.0])


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_single_turn_episodes_get_their_episode_advantage(scale: str) -> None:
    """One turn per episode and gamma 1: turn returns are rewards, both schemes agree
    with the episode advantage (and gigpo's step groups repeat it on top)."""
    rng = np.random.default_rng(0)
    rewards = rng.random(9).round(2)
    episodes = [
        EpisodeTurns(i // 3, float(r), (float(r),), ("prompt",)) for i, r in enumerate(rewards)
    ]
    expected = group_advantages(
        torch.tensor(rewards), torch.tensor([i // 3 for i in range(9)]), scale
    ).tolist()  # type: ignore[arg-type]
    for scheme, factor in (("episode", 1.0), ("turn_return", 1.0), ("gigpo", 1.5)):
        out = turn_advantages(episodes, scheme, scale, gamma=1.0, step_weight=0.5)  # type: ignore[arg-type]
        assert np.allclose([t[0] for t in out], np.array(expected) * factor, atol=1e-5), scheme


def test_step_keys_observation_and_prefix() -> None:
    a = episode(
        "a",
        [("prompt", "go"), ("assistant", "5"), ("env", "higher"), ("assistant", "7")],
        [0.0, 1.0],
    )
    b = episode(
        "b", [("prompt", "go"), ("assistant", "3"), ("env", "higher"), ("assistant", "8")], [0.0]
    )
    ta, tb = (episode_turns(0, [t], "observation") for t in (a, b))
    assert ta.keys == tb.keys  # same prompt, then the same reply "higher"
    assert tb.turn_rewards == (0.0, 0.0)  # the last turn got no reward: 0
    pa, pb = (episode_turns(0, [t], "prefix") for t in (a, b))
    assert pa.keys[0] == pb.keys[0] and pa.keys[1] != pb.keys[1]  # histories differ at "5"/"3"
    # the env's text decides, not the tokens before it: a different reply, another key
    c = episode(
        "c",
        [("prompt", "go"), ("assistant", "5"), ("env", "lower"), ("assistant", "2")],
        [0.0, 0.0],
    )
    assert episode_turns(0, [c], "observation").keys[1] != ta.keys[1]


def test_turn_advantages_reach_their_tokens() -> None:
    a = episode(
        "a",
        [("prompt", "go"), ("assistant", "55"), ("env", "hi"), ("assistant", "777")],
        [0.0, 1.0],
    )
    b = episode(
        "b", [("prompt", "go"), ("assistant", "33"), ("env", "hi"), ("assistant", "8")], [0.0, 0.0]
    )
    failed = episode("f", [("prompt", "go"), ("assistant", "9")], [5.0], status="failed")
    groups = [Group(Task("t", "e", 0), 3, [a, b, failed])]
    loss = LossConfig(advantage="turn_return", gamma=0.5)
    rows = rows_from_groups(groups, "none", loss)
    assert [r.trajectory.episode_id for r in rows] == ["a", "b"]  # failed: left out
    # returns a (0.5, 1), b (0, 0): mean 0.375
    assert np.allclose(rows[0].turn_advantages, [0.125, 0.625])  # type: ignore[arg-type]
    assert np.allclose(rows[1].turn_advantages, [-0.375, -0.375])  # type: ignore[arg-type]
    (mb,) = micro_batches(rows, max_tokens=10_000)
    expected = np.zeros((2, len(a)), dtype=np.float32)
    expected[0, 2:4], expected[0, 6:9] = 0.125, 0.625  # the two assistant spans of a
    expected[1, 2:4], expected[1, 6:7] = -0.375, -0.375
    assert mb.advantages.shape == mb.mask.shape
    on = mb.mask.bool()
    assert torch.allclose(mb.advantages[on], torch.from_numpy(expected[:, 1:])[on])
    # the episode scheme: every token of an episode gets the same advantage (as before)
    rows = rows_from_groups(groups, "none", LossConfig())
    assert [r.turn_advantages for r in rows] == [None, None]
    (mb,) = micro_batches(rows, max_tokens=10_000)
    assert torch.equal(mb.advantages[0][on[0]], torch.full((5,), 0.5))
    assert torch.equal(mb.advantages[1][on[1]], torch.full((3,), -0.5))


def test_segments_keep_the_turn_numbering() -> None:
    """An episode split in two segments: the second segment's turn is turn 1."""
    first = episode("s", [("prompt", "go"), ("assistant", "55")], [0.0, 1.0])
    second = episode("s", [("prompt", "go55hi"), ("assistant", "777")], [0.0, 1.0], segment=1)
    second = Trajectory.from_json(
        {
            **second.to_json(),
            "spans": [
                {"kind": "prompt", "start": 0, "end": 6, "turn": 1},
                {"kind": "assistant", "start": 6, "end": 9, "turn": 1},
            ],
        }
    )
    turns = episode_turns(0, [first, second], "prefix")
    assert turns.turn_rewards == (0.0, 1.0) and len(turns.keys) == 2
    assert token_advantages(second, (0.25, 0.75)).tolist() == [0.0] * 6 + [0.75] * 3
    assert token_advantages(first, (0.25, 0.75)).tolist() == [0.0] * 2 + [0.25] * 2
    with pytest.raises(ValueError, match="no turn advantage"):
        token_advantages(second, (0.25,))


def test_a_trajectory_without_spans_is_refused() -> None:
    bare = episode("n", [("prompt", "go"), ("assistant", "5")], [1.0])
    bare = Trajectory.from_json({**bare.to_json(), "spans": []})
    with pytest.raises(ValueError, match="no token spans"):
        episode_turns(0, [bare], "observation")


def test_advantage_keys_are_checked() -> None:
    cases = (
        ({"gamma": 1.5}, ["trainer.loss.gamma", "1.5", "[0, 1]"]),
        ({"step_weight": -1.0}, ["trainer.loss.step_weight", ">= 0"]),
        ({"advantage": "td"}, ["trainer.loss.advantage", "'td'", "gigpo"]),
        ({"step_key": "x"}, ["trainer.loss.step_key", "observation"]),
    )
    for kwargs, names in cases:
        with pytest.raises(ConfigError) as info:
            LossConfig(**kwargs)  # type: ignore[arg-type]
        for name in names:
            assert name in str(info.value), (name, str(info.value))

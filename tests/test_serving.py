"""``ServerSet``, the part both server pools share: member state, least-loaded choice, the
wait for a ready member (bounded while none is up, unbounded while the up ones are full),
and a crash of the health loop raised to waiters and at close."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentrl.serving import FIRST_BACKOFF_S, MAX_BACKOFF_S, Member, ServerSet, Waiting

pytestmark = pytest.mark.timeout(30)


class Unavailable(Exception):
    pass


def _set(members: list[Member], **kw: object) -> ServerSet[Member]:
    return ServerSet(
        members,
        owner="test",
        error=lambda e: RuntimeError(f"crashed: {e}"),
        health_interval_s=0.01,
        reconnect_timeout_s=0.3,
        **kw,  # type: ignore[arg-type]
    )


def test_member_down_backoff_doubles_to_the_most_and_up_resets() -> None:
    m = Member("http://a")
    assert m.take_down("gone") and not m.take_down("again") and m.reason == "gone"
    for _ in range(10):
        m.retry_later("still gone")
    assert m.backoff_s == MAX_BACKOFF_S and not m.due
    m.bring_up()
    assert m.up and m.reason == "" and m.backoff_s == FIRST_BACKOFF_S
    assert [m.check_failed() for _ in range(3)] == [False, False, True]


async def test_least_loaded_and_preferred_and_rotation_of_ties() -> None:
    a, b, c = Member("a", load=2), Member("b", load=1), Member("c", load=1)
    servers = _set([a, b, c])
    assert await servers.wait_for_one(lambda m: True, Unavailable) is b  # first of the ties
    assert await servers.wait_for_one(lambda m: True, Unavailable, prefer=a) is a
    c.up = False
    assert await servers.wait_for_one(lambda m: True, Unavailable, prefer=c) is b
    rotating = _set([Member("x"), Member("y")], rotate_ties=True)
    picks = {(await rotating.wait_for_one(lambda m: True, Unavailable)).url for _ in range(4)}
    assert picks == {"x", "y"}


async def test_no_member_up_waits_then_raises_and_a_full_one_waits_without_deadline() -> None:
    down = Member("a")
    down.take_down("refused")
    servers = _set([down])
    t0 = time.monotonic()
    with pytest.raises(Unavailable):
        await servers.wait_for_one(lambda m: True, Unavailable)
    assert 0.25 < time.monotonic() - t0 < 2.0
    assert await servers.wait_for_one(lambda m: True, Unavailable, wait=False) is None
    # a caller that tries again after a failed try keeps its deadline: no fresh wait
    waiting = Waiting(deadline=time.monotonic())
    t0 = time.monotonic()
    with pytest.raises(Unavailable):
        await servers.wait_for_one(lambda m: True, Unavailable, waiting=waiting)
    assert time.monotonic() - t0 < 0.1

    full = Member("b", load=1)
    servers = _set([full])
    waiter = asyncio.create_task(
        servers.wait_for_one(lambda m: m.load < 1, Unavailable, full=lambda m: True)
    )
    await asyncio.sleep(0.6)  # twice the reconnect timeout: still waiting
    assert not waiter.done()
    full.load = 0
    servers.notify()
    assert await asyncio.wait_for(waiter, 2) is full


async def test_a_stop_ends_the_wait_and_a_health_crash_wakes_the_waiters() -> None:
    down = Member("a")
    down.take_down("refused")
    servers = _set([down])
    stopped = False
    waiter = asyncio.create_task(
        servers.wait_for_one(lambda m: True, Unavailable, stop=lambda: stopped)
    )
    await asyncio.sleep(0.05)
    stopped = True
    servers.notify()
    assert await asyncio.wait_for(waiter, 1) is None

    servers = _set([down])
    servers.reconnect_timeout_s = 60
    checked: list[str] = []

    async def check(m: Member) -> None:
        checked.append(m.url)
        if len(checked) == 3:
            raise ValueError("a bug in the check")

    waiter = asyncio.create_task(servers.wait_for_one(lambda m: True, Unavailable))
    servers.start_health(check, name="health", check_first=True)
    with pytest.raises(RuntimeError, match="crashed: a bug in the check"):
        await asyncio.wait_for(waiter, 5)  # not after 60 s
    with pytest.raises(RuntimeError, match="crashed: a bug"):
        await servers.close()

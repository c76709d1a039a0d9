"""``EnvServerPool`` owns its health checks: if they crash, the next session and the pool's
close raise one InfraError that says how to continue (no env server is needed: the pool is
pointed at a port nothing listens on)."""

from __future__ import annotations

import socket

import pytest

from agentrl.errors import InfraError
from agentrl.remote import EnvServerPool
from agentrl.remote.servers import Member

pytestmark = pytest.mark.timeout(60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_crashed_health_check_is_raised_at_the_next_session_and_at_close() -> None:
    pool = EnvServerPool(
        [f"http://127.0.0.1:{_free_port()}"],
        "bench/Echo-v0",
        health_interval_s=0.01,
        reconnect_timeout_s=30,
    )
    await pool.start()  # the server does not answer: it is down, the checks go on
    assert not pool.members[0].up

    async def broken(member: Member) -> None:
        raise RuntimeError("a bug in the health check")

    pool._check = broken  # type: ignore[method-assign]
    with pytest.raises(InfraError, match=r"health checks crashed \(RuntimeError: a bug") as caught:
        await pool.open()  # it would wait 30 s for a server; the crash wakes it
    assert "--resume" in str(caught.value)
    with pytest.raises(InfraError, match="health checks crashed"):
        await pool.close()
    assert pool.http is not None and pool.http.closed  # closed all the same

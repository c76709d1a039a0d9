"""Every registered env passes both checkers; each shipped env behaves as documented."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env

import envs  # noqa: F401  (registers the agentrl/* ids)
from agentrl import check_env
from agentrl.env import ENV_THREADS, AsyncTextEnv, EnvHandle, make_env, register_env

REGISTERED = sorted(i for i in gym.registry if i.startswith("agentrl/"))


def test_the_shipped_envs_are_all_registered() -> None:
    names = {i.split("/")[1].split("-")[0] for i in REGISTERED}
    assert {"Calculator", "GuessNumber", "PythonPuzzle", "Maze", "Sql"} <= names
    assert {"FrozenLake", "Taxi"} <= names


@pytest.mark.parametrize("env_id", REGISTERED)
def test_registered_env_passes_gymnasium_and_agentrl_checks(env_id: str) -> None:
    env = make_env(env_id)
    gym_check_env(env.unwrapped, skip_render_check=True)
    env.close()
    results = check_env(env_id)
    assert [r.rule for r in results] == [
        "gymnasium",
        "seeded-determinism",
        "isolation",
        "state-round-trip",
        "robust-actions",
        "prefix-preserving",
    ]
    assert all(r.passed for r in results), results


def test_guess_number_gives_feedback_until_found() -> None:
    env = make_env("agentrl/GuessNumber-v0")
    env.reset(seed=4)
    low, high = 1, 100
    for _ in range(7):  # binary search always wins in 7 guesses over 1..100
        guess = (low + high) // 2
        obs, reward, terminated, truncated, _ = env.step(f"Guess: {guess}")
        if terminated:
            assert reward == 1.0 and guess == env.unwrapped.secret
            break
        assert obs in ("Higher.", "Lower.") and not truncated
        low, high = (guess + 1, high) if obs == "Higher." else (low, guess - 1)
    else:
        pytest.fail("binary search did not find the number in 7 guesses")


def test_maze_is_solvable_and_forks_from_get_state() -> None:
    env = make_env("agentrl/Maze-v0")
    env.reset(seed=11)
    inner = env.unwrapped
    path = _shortest_path(inner.grid, inner.pos, inner.goal)
    fork = make_env("agentrl/Maze-v0")
    fork.reset(seed=0)
    for i, move in enumerate(path):
        if i == len(path) // 2:
            fork.unwrapped.set_state(inner.get_state())
        _, reward, terminated, truncated, _ = env.step(f"I will go {move}.")
    assert (reward, terminated, truncated) == (1.0, True, False)
    for move in path[len(path) // 2 :]:
        result = fork.step(move)
    assert result[1:4] == (1.0, True, False)
    wall = make_env("agentrl/Maze-v0")
    wall.reset(seed=11)
    blocked = [m for m in ("up", "left") if wall.step(m)[0].startswith("A wall")]
    assert blocked == ["up", "left"]  # the start is the top-left corner


def _shortest_path(grid: list[str], start: tuple[int, int], goal: tuple[int, int]) -> list[str]:
    from envs.maze import MOVES

    frontier, came = [start], {start: (start, "")}
    while frontier:
        nxt = []
        for r, c in frontier:
            for name, (dr, dc) in MOVES.items():
                cell = (r + dr, c + dc)
                if grid[cell[0]][cell[1]] != "#" and cell not in came:
                    came[cell] = ((r, c), name)
                    nxt.append(cell)
        frontier = nxt
    path, cell = [], goal
    while cell != start:
        cell, move = came[cell]
        path.append(move)
    return path[::-1]


def test_sql_env_builds_a_database_per_episode_and_cleans_up() -> None:
    env = make_env("agentrl/Sql-v0")
    _, info = env.reset(seed=1)
    inner = env.unwrapped
    (query,) = inner.tools
    department = inner.department
    sql = {0: "SUM(salary)", 1: "COUNT(*)", 2: "MAX(salary)"}[inner.kind]
    rows = query(f"SELECT {sql} FROM employees WHERE department = '{department}'")
    assert rows.splitlines()[1] == str(info["target"])
    assert query("DELETE FROM employees").startswith("Error:")  # read-only
    first = query("SELECT * FROM employees ORDER BY id")
    env.reset(seed=2)
    assert query("SELECT * FROM employees ORDER BY id") != first
    assert env.step(f"Answer: {inner.target}")[1] == 1.0
    env.close()
    env.close()
    assert not inner.database.parent.exists()


async def test_python_puzzle_is_solvable_with_the_sandbox_tool() -> None:
    env = make_env("agentrl/PythonPuzzle-v0")
    env.reset(seed=0)
    inner = env.unwrapped
    inner.kind, inner.n = 2, 1000  # primes below 1000
    (python,) = inner.tools
    code = "print(sum(all(n % d for d in range(2, n)) for n in range(2, 1000)))"
    out = await python(code)
    assert out.strip().splitlines()[-1] == "168" == str(inner.target), out
    assert env.step("Answer: 168")[1] == 1.0


class CountdownEnv(AsyncTextEnv):
    """An async env (as if it did I/O): count down from a seeded start."""

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        await super().areset(seed=seed)
        await asyncio.sleep(0)
        self.n = int(self.np_random.integers(3, 6))
        self.thread = threading.get_ident()
        return f"Count down from {self.n}.", {}

    async def astep(self, action: str):
        await asyncio.sleep(0)
        self.thread = threading.get_ident()
        if action.strip() == str(self.n - 1):
            self.n -= 1
        return f"Now {self.n}.", float(self.n == 0), self.n == 0, False, {}

    def get_state(self) -> dict[str, Any]:
        return {"n": self.n}

    def set_state(self, state: dict[str, Any]) -> None:
        self.n = state["n"]


async def test_async_env_runs_on_the_loop_and_sync_env_in_a_thread() -> None:
    register_env("tests/Countdown-v0", CountdownEnv, max_episode_steps=2)
    handle = EnvHandle(gym.make("tests/Countdown-v0"))
    assert handle.is_async
    await handle.reset(seed=1)
    assert handle.inner.thread == threading.get_ident()  # awaited on this loop
    _, _, _, truncated, _ = await handle.step("nonsense")
    assert not truncated
    _, _, _, truncated, _ = await handle.step("nonsense")
    assert truncated  # the registered max_episode_steps applies on the async path too
    with pytest.raises(RuntimeError, match=r"await env\.areset"):
        handle.inner.reset(seed=1)  # the sync form refuses inside a running loop
    sync = EnvHandle(make_env("agentrl/GuessNumber-v0"))
    assert not sync.is_async
    await sync.reset(seed=1)
    seen: list[int] = []
    original = sync.inner.step
    sync.inner.step = lambda a: (seen.append(threading.get_ident()), original(a))[1]
    await sync.step("Guess: 50")
    assert seen and seen[0] != threading.get_ident()
    await handle.close()
    await sync.close()


async def test_a_closed_env_hands_its_thread_to_the_next_unless_a_call_hung() -> None:
    """Envs built one after another reuse one worker thread; a thread stuck in a call
    that missed its deadline is let go, never handed to another env."""
    name = "tests-env-threads"

    async def thread_of(handle: EnvHandle) -> int:
        seen: list[int] = []
        original = handle.inner.step
        handle.inner.step = lambda a: (seen.append(threading.get_ident()), original(a))[1]
        await handle.step("Guess: 50")
        return seen[0]

    first = await EnvHandle.build(make_env, "agentrl/GuessNumber-v0", {}, thread_name=name)
    await first.reset(seed=1)
    used = await thread_of(first)
    await first.close()
    first.abandon()
    with pytest.raises(RuntimeError, match="was closed"):
        await first.step("Guess: 1")
    second = await EnvHandle.build(make_env, "agentrl/GuessNumber-v0", {}, thread_name=name)
    await second.reset(seed=1)
    assert await thread_of(second) == used  # the same thread, handed on
    release = threading.Event()
    second.inner.step = lambda a: release.wait(30)  # a call that hangs
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await second.step("Guess: 2")
    second.abandon()  # stuck: let go
    third = await EnvHandle.build(make_env, "agentrl/GuessNumber-v0", {}, thread_name=name)
    await third.reset(seed=1)
    assert await thread_of(third) != used
    release.set()
    await third.close()
    third.abandon()
    assert ENV_THREADS.drain() >= 1 and ENV_THREADS.idle() == 0  # idle ones can be let go


async def test_close_runs_in_the_envs_thread_unless_it_does_nothing() -> None:
    """An env whose own ``close`` (or a wrapper's) does something is closed in its thread;
    one whose ``close`` is Gymnasium's no-op (wrappers that only pass it on) is not sent
    there at all."""

    class Closing(CountdownEnv):
        def __init__(self) -> None:
            super().__init__()
            self.closed_in: int | None = None

        def close(self) -> None:
            self.closed_in = threading.get_ident()

    class Noting(gym.Wrapper):  # type: ignore[type-arg]
        closed_in: int | None = None

        def close(self) -> None:
            Noting.closed_in = threading.get_ident()
            super().close()

    for env, where in (
        (Closing(), lambda h: h.inner.closed_in),
        (Noting(gym.make("agentrl/GuessNumber-v0")), lambda h: Noting.closed_in),
    ):
        handle = EnvHandle(env)
        await handle.close()
        assert where(handle) is not None and where(handle) != threading.get_ident()
        assert handle._lane is not None and handle._lane.thread is not None
        handle.abandon()

    quiet = EnvHandle(make_env("agentrl/GuessNumber-v0"))
    assert type(quiet.inner).close is gym.Env.close
    await quiet.close()
    assert quiet._lane is None  # no thread was taken for it
    quiet.abandon()


async def test_an_async_env_hands_its_thread_back_once_built() -> None:
    """An async env is built in a worker thread (constructors may block) but awaited on
    the loop, so its thread goes back at once: envs alive at once do not hold a thread
    each; a sync env keeps its own."""
    register_env("tests/Countdown-v0", CountdownEnv, max_episode_steps=2)
    name = "tests-async-build"
    built_in: list[int] = []

    def make(env_id: str, **kwargs: Any) -> Any:
        built_in.append(threading.get_ident())
        return make_env(env_id, **kwargs)

    first = await EnvHandle.build(make, "tests/Countdown-v0", {}, thread_name=name)
    second = await EnvHandle.build(make, "tests/Countdown-v0", {}, thread_name=name)
    assert first.is_async and first._lane is None and second._lane is None
    assert built_in[0] == built_in[1] != threading.get_ident()  # one thread, both alive
    await first.reset(seed=1)
    await first.step("nonsense")
    sync = await EnvHandle.build(make, "agentrl/GuessNumber-v0", {}, thread_name=name)
    assert built_in[2] == built_in[0] and sync._lane is not None  # it keeps the thread
    third = await EnvHandle.build(make, "tests/Countdown-v0", {}, thread_name=name)
    assert built_in[3] != built_in[0]  # that one is the sync env's now
    for handle in (first, second, sync, third):
        await handle.close()
        handle.abandon()
    assert ENV_THREADS.drain() >= 2


def test_async_env_passes_both_checkers_through_its_sync_form() -> None:
    register_env("tests/Countdown-v0", CountdownEnv, max_episode_steps=2)
    assert all(r.passed for r in check_env("tests/Countdown-v0"))

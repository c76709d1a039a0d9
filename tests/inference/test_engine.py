"""The in-process AsyncLLM client against real vLLM (CPU build, float32, eager)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from agentrl.errors import ModelNotFoundError
from agentrl.inference.base import SamplingConfig
from agentrl.inference.engine import STREAM_INTERVAL, VLLMEngineClient
from agentrl.runtime import cores
from tests.inference.client_contract import PROMPT, ClientContract, long_greedy, token_counts
from tests.runtime.test_cores import thread_core_sets

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(tiny_model: Path) -> AsyncIterator[VLLMEngineClient]:
    engine = await VLLMEngineClient.start(str(tiny_model), max_lora_rank=8)
    try:
        yield engine
    finally:
        await engine.close()
        await engine.close()  # safe twice


class TestEngineClient(ClientContract):
    pass


async def test_missing_model_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        await VLLMEngineClient.start(str(tmp_path / "no-such-model"))
    with pytest.raises(ModelNotFoundError, match=r"no config\.json"):
        await VLLMEngineClient.start(str(tmp_path))


async def test_tokens_stream_in_steps_and_an_abort_cut_between_them_loses_none(
    client: VLLMEngineClient,
) -> None:
    """Outputs come every STREAM_INTERVAL tokens (the first at once); an abort between two
    of them still hands back every token sampled, the same as the uncut generation's,
    the ones not streamed yet included."""
    full = await long_greedy(client, "steps-full")
    beyond_streamed: list[bool] = []
    # An abort may land right on an output (1 in 16), or while the engine has not stepped
    # since the last one (a busy machine: all 3 cuts of one CI run did): cut until one
    # lands between outputs, at most 8 times, each after a different wait. A client that
    # drops the tokens not streamed yet fails every cut.
    for attempt, wait_s in enumerate((0.05, 0.08, 0.03, 0.12, 0.06, 0.1, 0.04, 0.09)):
        if any(beyond_streamed):
            break
        rid = f"steps-{attempt}"
        task = asyncio.create_task(
            client.generate(PROMPT, SamplingConfig(max_tokens=200, temperature=0.0), rid)
        )
        await asyncio.sleep(0)  # the request is in flight
        seen = await token_counts(client, rid, task)
        assert seen[:3] == [1, 1 + STREAM_INTERVAL, 1 + 2 * STREAM_INTERVAL], seen
        await asyncio.sleep(wait_s)  # the engine samples on past the last output sent
        streamed = client.requests.sampled(rid)
        partial = await client.abort(rid)
        assert partial is not None and partial.finish_reason == "abort"
        n = len(partial.token_ids)
        assert n >= streamed and len(partial.logprobs) == n
        assert partial.token_ids == full.token_ids[:n]
        assert partial.logprobs == pytest.approx(full.logprobs[:n], abs=1e-4)
        beyond_streamed.append(n > streamed)
    assert any(beyond_streamed), "an abort handed back only the tokens already streamed"


@pytest.mark.skipif(
    not cores.supported() or len(os.sched_getaffinity(0)) < 2, reason="Linux, 2+ cores"
)
async def test_this_process_keeps_off_the_core_vllms_worker_bound_itself_to(
    client: VLLMEngineClient,
) -> None:
    """vLLM's CPU worker binds itself to core 0 of this 2-core machine and spins; every
    thread of this process (the engine's client, the event loop, their helpers) runs on
    the other cores, so none preempts the forward pass (agentrl.runtime.cores)."""
    bound = cores.worker_cores()
    assert bound, "vLLM's CPU worker bound itself to some cores (VLLM_CPU_OMP_THREADS_BIND)"
    rest = frozenset(cores.process_cores() - bound)
    assert rest and client._cores_claim is not None
    assert thread_core_sets() == {rest}
    # and the engine still samples
    four = SamplingConfig(max_tokens=4, ignore_eos=True)
    out = await client.generate(PROMPT, four, "after-keep-off")
    assert len(out.token_ids) == 4


async def test_close_lets_the_engine_core_exit_on_its_own_on_a_busy_machine(
    client: VLLMEngineClient,
) -> None:
    """Closing the client (last in this module: it ends the shared engine) waits for
    vLLM's engine core process to exit by itself, even with every core busy: killed part
    way through its teardown, it left its shared memory to the resource tracker, which
    printed "leaked shared_memory objects" after `agentrl rollout`'s results. vLLM's own
    5 s was too short here: two busy loops made the teardown take 6-7 s."""
    processes = list(client._engine.engine_core.resources.engine_manager.processes)
    assert processes and all(p.is_alive() for p in processes)
    with cores.every_core():  # busy on every core, not only those this process keeps to
        busy = [
            await asyncio.create_subprocess_exec(sys.executable, "-c", "while True: pass")
            for _ in range(2)
        ]
    try:
        await client.close()
    finally:
        for p in busy:
            p.kill()
            await p.wait()
    assert [p.exitcode for p in processes] == [0] * len(processes), (
        "the engine core was killed (negative exit code) instead of exiting on its own"
    )
    # closed: this process has every core back
    assert thread_core_sets() == {frozenset(cores.process_cores())}

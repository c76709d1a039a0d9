"""The behaviour every InferenceClient must show, run against real vLLM.

``test_engine.py`` and ``test_server.py`` subclass :class:`ClientContract` with a
module-scoped ``client`` fixture (one engine per module). Test order matters inside a
class: the LoRA test runs last because it leaves the adapter loaded.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from agentrl.errors import ContextOverflowError
from agentrl.inference.base import Generation, InferenceClient, SamplingConfig

PROMPT = [15, 27, 99, 120, 7]
GREEDY = SamplingConfig(max_tokens=48, temperature=0.0)


def reference_logprobs(
    model_dir: Path, prompt: list[int], tokens: tuple[int, ...], adapter: Path | None = None
) -> list[float]:
    """Logprob of each of ``tokens`` after ``prompt`` under transformers (+ peft)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    ids = torch.tensor([prompt + list(tokens)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1]
    logprobs = torch.log_softmax(logits, dim=-1)
    return logprobs[torch.arange(len(tokens)), torch.tensor(tokens)].tolist()


async def long_greedy(client: InferenceClient, request_id: str) -> Generation:
    """A greedy generation long enough to abort in the middle of."""
    result = await client.generate(
        PROMPT, SamplingConfig(max_tokens=200, temperature=0.0), request_id
    )
    assert len(result.token_ids) >= 40, (
        f"the tiny model stopped after {len(result.token_ids)} tokens"
    )
    return result


async def token_counts(
    client: InferenceClient, request_id: str, task: asyncio.Task, outputs: int = 3
) -> list[int]:
    """A running request's sampled-token count at each of its first ``outputs`` outputs
    (fewer if ``task``, the request, ends first)."""
    seen: list[int] = []
    while len(seen) < outputs and not task.done():
        seen.append(
            await client.requests.wait_for_tokens(request_id, (seen[-1] if seen else 0) + 1)
        )
    return seen


class ClientContract:
    async def test_one_logprob_and_version_per_sampled_token(self, client: InferenceClient) -> None:
        results = await asyncio.gather(
            *(
                client.generate(PROMPT, SamplingConfig(max_tokens=32, seed=i), f"sample-{i}")
                for i in range(8)
            )
        )
        for result in results:
            assert 0 < len(result.token_ids) <= 32
            assert len(result.logprobs) == len(result.token_ids)
            assert all(lp <= 0 and math.isfinite(lp) for lp in result.logprobs)
            assert result.versions == (client.version,) * len(result.token_ids)
            assert result.finish_reason in ("stop", "length")
            assert result.prompt_tokens == len(PROMPT)
        assert len({r.token_ids for r in results}) > 1, "different seeds gave identical samples"

    async def test_logprobs_match_transformers(
        self, client: InferenceClient, tiny_model: Path
    ) -> None:
        result = await client.generate(PROMPT, SamplingConfig(max_tokens=24, seed=3), "ref")
        expected = reference_logprobs(tiny_model, PROMPT, result.token_ids)
        assert result.logprobs == pytest.approx(expected, abs=1e-3)

    async def test_abort_returns_partial_tokens_and_resume_reproduces(
        self, client: InferenceClient
    ) -> None:
        full = await long_greedy(client, "full")
        task = asyncio.create_task(
            client.generate(PROMPT, SamplingConfig(max_tokens=200, temperature=0.0), "cut")
        )
        await asyncio.sleep(0)
        await client.requests.wait_for_tokens("cut", 10)
        partial = await client.abort("cut")
        assert partial is not None and partial == await task
        assert partial.finish_reason == "abort"
        n = len(partial.token_ids)
        assert 10 <= n < len(full.token_ids), f"abort kept {n} of {len(full.token_ids)} tokens"
        assert partial.token_ids == full.token_ids[:n]
        assert len(partial.logprobs) == n

        rest = await client.generate(
            PROMPT + list(partial.token_ids),
            SamplingConfig(max_tokens=200 - n, temperature=0.0),
            "resume",
        )
        assert partial.token_ids + rest.token_ids == full.token_ids
        assert partial.logprobs + rest.logprobs == pytest.approx(full.logprobs, abs=1e-4)
        assert await client.abort("not-running") is None

    async def test_prompt_longer_than_context_is_refused(self, client: InferenceClient) -> None:
        with pytest.raises(ContextOverflowError, match=r"inference\.max_model_len"):
            await client.generate([5] * client.max_model_len, GREEDY, "too-long")
        # A prompt that leaves room for a few tokens is clamped to the window.
        result = await client.generate([5] * (client.max_model_len - 3), GREEDY, "nearly-full")
        assert len(result.token_ids) <= 3

    async def test_reload_weights_changes_output_and_originals_restore_it(
        self, client: InferenceClient, tiny_model: Path, perturbed_weights: Path
    ) -> None:
        before = await client.generate(PROMPT, GREEDY, "before")
        v0 = client.version
        v1 = await client.reload_weights(str(perturbed_weights))
        assert v1 == v0 + 1 == client.version
        changed = await client.generate(PROMPT, GREEDY, "changed")
        assert changed.token_ids != before.token_ids
        assert changed.versions == (v1,) * len(changed.token_ids)
        expected = reference_logprobs(perturbed_weights, PROMPT, changed.token_ids)
        assert changed.logprobs == pytest.approx(expected, abs=1e-3)

        v2 = await client.reload_weights(str(tiny_model))
        assert v2 == v1 + 1
        restored = await client.generate(PROMPT, GREEDY, "restored")
        assert restored.token_ids == before.token_ids
        assert restored.logprobs == pytest.approx(before.logprobs, abs=1e-5)
        assert restored.versions == (v2,) * len(restored.token_ids)

    async def test_zz_lora_adapter_changes_output(
        self, client: InferenceClient, tiny_model: Path, lora_adapter: Path
    ) -> None:
        before = await client.generate(PROMPT, GREEDY, "no-adapter")
        version = await client.load_lora_adapter(str(lora_adapter))
        assert version == client.version
        adapted = await client.generate(PROMPT, GREEDY, "adapter")
        assert adapted.token_ids != before.token_ids
        assert adapted.versions == (version,) * len(adapted.token_ids)
        expected = reference_logprobs(tiny_model, PROMPT, adapted.token_ids, adapter=lora_adapter)
        assert adapted.logprobs == pytest.approx(expected, abs=1e-3)
        # Loading a second adapter replaces the first.
        again = await client.load_lora_adapter(str(lora_adapter))
        assert again == version + 1
        same = await client.generate(PROMPT, GREEDY, "adapter-again")
        assert same.token_ids == adapted.token_ids

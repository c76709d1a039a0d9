"""Two non-Hermes families through real vLLM: Llama 3.2 (``llama3_json``) and Mistral v0.3
(``mistral``).

Each runs a tiny model with the family's tokenizer and chat template, taught one tool
episode (:mod:`tests.models.family_model`), in vLLM's in-process engine (float32 on CPU,
greedy), through :class:`~agentrl.rollout.EpisodeRunner` with the chat format resolved
from the loaded tokenizer (Llama's date pinned by ``model.chat_template_kwargs``).
Checked: vLLM stopped every turn at the family's end-of-turn token; the call it sampled
was read by vLLM's parser for the format and the tool ran; the result came back the way
the family's template shows it; the token record is exactly the sampled tokens plus the
template's renderings, every sampled token labelled with the engine's version; and it is
the record the model was taught.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.chat.formats import resolve_chat_format
from agentrl.config import InferenceConfig
from agentrl.inference.engine import VLLMEngineClient
from tests.models.families import (
    RESULT_SHOWN,
    RecordingClient,
    assert_token_record,
    family,
    run_task,
)
from tests.models.family_model import SETTINGS, TaughtModel, build_family_model

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

FAMILIES = ["llama3.2", "mistral-v0.3"]


@pytest.fixture(scope="session", params=FAMILIES)
def taught(request: pytest.FixtureRequest, model_cache: Path) -> TaughtModel:
    """The family's taught model, built once per test session."""
    return build_family_model(family(request.param), model_cache)


async def test_the_family_format_through_real_vllm(taught: TaughtModel) -> None:
    from transformers import AutoTokenizer

    f = taught.family
    tokenizer = AutoTokenizer.from_pretrained(taught.path)
    chat = resolve_chat_format(tokenizer, SETTINGS)
    assert chat.tools is not None and chat.tools.name == f.tool_format
    config = InferenceConfig(max_model_len=512, kv_cache_mib=64)
    async with await VLLMEngineClient.start(str(taught.path), config) as engine:
        version = engine.version
        client = RecordingClient(engine, tokenizer, f.eos)
        (traj,), runner = await run_task(client, tokenizer, model=SETTINGS, temperature=0.0)
    assert (traj.status, traj.reward) == ("finished", 1.0), traj.reason
    ends = [(g.finish_reason, g.token_ids[-1]) for _, g in client.calls]
    assert ends == [("stop", client.eot)] * 2  # vLLM stopped at the family's end of turn
    assert traj.env_log[1]["tool"] == "add" and traj.env_log[1]["arguments"] == {"a": 2, "b": 3}
    assert traj.env_log[1]["result"] == "5" and traj.env_log[2]["action"] == "Answer: 5"
    assert not any(k.startswith("tool_errors/") for k in runner.metrics.counters)
    assert RESULT_SHOWN[f.name] in tokenizer.decode(traj.token_ids, skip_special_tokens=False)
    assert_token_record(traj, client, tokenizer, **SETTINGS.chat_template_kwargs)
    sampled = traj.loss_mask.astype(bool)
    assert sampled.sum() > 0 and (traj.versions[sampled] == version).all()
    assert traj.token_ids.tolist() == taught.token_ids  # what the fit taught, token for token

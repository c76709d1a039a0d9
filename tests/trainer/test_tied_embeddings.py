"""Models with tied input and output embeddings (Qwen2.5-0.5B and 1.5B) publish.

safetensors refuses tensors that share memory, so publishing such a model failed with
"Some tensors share memory". The published file now holds the shared tensor once (the
input embeddings' name, which vLLM and transformers tie again on load); loading it back
gives the trainer's weights exactly, the LM head tied again. (vLLM's in-place reload of
a tied head on CPU is a known vLLM limit, see agentrl/models/tiny.py; on a GPU it ties.)
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from agentrl.config import TrainerConfig
from agentrl.trainer.publish import WeightPublisher
from agentrl.trainer.trainer import Trainer
from tests.trainer.test_checkpoint import synthetic_groups


@pytest.fixture(scope="module")
def tied_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    folder = tmp_path_factory.mktemp("tied")
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_a_tied_model_publishes_and_loads_back_exactly(tied_model: Path, tmp_path: Path) -> None:
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    trainer = Trainer(str(tied_model), TrainerConfig(lr=1e-2), temperature=1.0, seed=0)
    model = trainer.model
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    trainer.train_step(synthetic_groups(0))  # weights moved from the saved ones
    publisher = WeightPublisher(trainer, controller=None, directory=tmp_path / "w")  # type: ignore[arg-type]
    target = tmp_path / "w" / "v1"
    nbytes = publisher._save(target)
    with safe_open(str(target / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    listed = sum(v.numel() * v.element_size() for v in model.state_dict().values())
    shared = model.lm_head.weight.numel() * 4  # the file: each tensor once, plus a header
    assert listed - shared < nbytes < listed - shared + 16_384, (nbytes, listed, shared)
    shutil.copy(tied_model / "config.json", target / "config.json")
    loaded = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    mine, theirs = model.state_dict(), loaded.state_dict()
    assert mine.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert torch.equal(tensor, mine[name]), name
    before = AutoModelForCausalLM.from_pretrained(tied_model, dtype=torch.float32)
    assert not torch.equal(theirs["lm_head.weight"], before.lm_head.weight), "trained, not saved"


def test_a_tied_model_checkpoints_and_resumes_exactly(tied_model: Path, tmp_path: Path) -> None:
    from agentrl.trainer.checkpoint import load_checkpoint, save_checkpoint

    first = Trainer(str(tied_model), TrainerConfig(lr=1e-2), temperature=1.0, seed=0)
    first.train_step(synthetic_groups(0))
    folder = save_checkpoint(first, tmp_path / "checkpoints")
    second = Trainer(str(tied_model), TrainerConfig(lr=1e-2), temperature=1.0, seed=0)
    load_checkpoint(second, folder)
    model = second.model
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    for name, tensor in first.model.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name]), name
    stats = [t.train_step(synthetic_groups(1)) for t in (first, second)]
    assert stats[0].loss == stats[1].loss
    for name, tensor in first.model.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name]), f"{name} after a resumed step"

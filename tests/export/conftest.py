"""The recorded run the export tests share (recorded once per session)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.export.recorded_run import record_run


@pytest.fixture(scope="session")
def run_dir(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    return asyncio.run(record_run(tokenizer, tmp_path_factory.mktemp("export") / "run"))

"""Tokenizer fixtures for the corpus tests (built in-process, nothing downloaded)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.corpus.tiny import build_bpe_tokenizer, build_tiktoken_file


@pytest.fixture(scope="session")
def bpe_tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bpe_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


@pytest.fixture(scope="session")
def tiktoken_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiktoken_file(tmp_path_factory.mktemp("tt") / "tiny.tiktoken")

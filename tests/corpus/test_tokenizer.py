"""Batch counts agree with encoding one text at a time, for both tokenizer kinds."""

from __future__ import annotations

from pathlib import Path

import pytest

from skrull.corpus.text import render_chat, text_extractor
from skrull.corpus.tokenizer import load_tokenizer
from skrull.solver.errors import RequestError
from tests.corpus.tiny import sample_texts


def test_tokenizers_json_counts_match_single_encodes(bpe_tokenizer_json: Path) -> None:
    from tokenizers import Tokenizer

    texts = sample_texts(50, seed=3)
    single = Tokenizer.from_file(str(bpe_tokenizer_json))
    counts = load_tokenizer(bpe_tokenizer_json).count(texts)
    assert counts == [len(single.encode(t).ids) for t in texts]
    assert all(0 < c < len(t) + 1 for c, t in zip(counts, texts, strict=True))  # BPE merges shorten texts
    assert load_tokenizer(bpe_tokenizer_json.parent).kind == "tokenizers"  # a directory holding tokenizer.json


def test_tiktoken_file_counts_with_merges(tiktoken_file: Path) -> None:
    tok = load_tokenizer(tiktoken_file)
    assert tok.kind == "tiktoken"
    # "the" is one token, " the" is one token, "quick" = "qu" + "ick"
    assert tok.count(["the", "the the", "quick", "xyz"]) == [1, 2, 2, 3]


def test_rejects_a_missing_or_malformed_tokenizer(tmp_path: Path) -> None:
    with pytest.raises(RequestError, match="--tokenizer"):
        load_tokenizer(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(RequestError, match="not a tokenizers JSON file"):
        load_tokenizer(bad)


def test_fields_join_and_chat_templates_render() -> None:
    assert text_extractor(fields=["q", "a"], chat_template=None)({"q": "hi", "a": "yo"}, 0) == "hi\nyo"
    msgs = {"messages": [{"role": "user", "content": "hi"}, {"from": "gpt", "value": "yo"}]}
    chat = text_extractor(fields=None, chat_template="chatml")(msgs, 0)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>gpt\nyo<|im_end|>\n"
    assert render_chat([("user", "x")], "llama3").startswith("<|begin_of_text|><|start_header_id|>user")


def test_rejects_a_row_without_the_field_naming_row_and_field() -> None:
    with pytest.raises(RequestError, match=r"row 7\.prompt"):
        text_extractor(fields=["prompt"], chat_template=None)({"text": "x"}, 7)

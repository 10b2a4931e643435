"""Chats rendered by the tokenizer's own chat template: counts equal what ``apply_chat_template`` tokenizes."""

from __future__ import annotations

from pathlib import Path

import pytest

from skrull.corpus.chat_template import tokenizer_chat_renderer
from skrull.corpus.text import text_extractor
from skrull.corpus.tokenizer import load_tokenizer
from skrull.solver.errors import RequestError
from tests.corpus.tiny import build_chat_tokenizer_dir, sample_texts


@pytest.fixture(scope="module")
def chat_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_chat_tokenizer_dir(tmp_path_factory.mktemp("chat-tok"))


def chats(n: int) -> list[list[dict[str, str]]]:
    texts = sample_texts(n, seed=3)
    return [[{"role": "user", "content": t[:30]}, {"role": "assistant", "content": t}] for t in texts]


def test_counts_equal_the_tokens_apply_chat_template_gives(chat_tokenizer_dir: Path) -> None:
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(chat_tokenizer_dir), local_files_only=True)
    conversations = chats(12)
    expected = [len(reference.apply_chat_template(c, tokenize=True, return_dict=False)) for c in conversations]
    extract = text_extractor(
        fields=None, chat_template="tokenizer", chat_renderer=tokenizer_chat_renderer(chat_tokenizer_dir)
    )
    counter = load_tokenizer(chat_tokenizer_dir, add_special_tokens=False)
    texts = [extract({"messages": c}, k) for k, c in enumerate(conversations)]
    assert counter.count(texts) == expected
    assert texts[0].startswith("<s>[user] ")  # the template's BOS, written once


def test_sharegpt_spelling_renders_like_role_and_content(chat_tokenizer_dir: Path) -> None:
    render = tokenizer_chat_renderer(chat_tokenizer_dir)
    extract = text_extractor(fields=None, chat_template="tokenizer", chat_renderer=render)
    share = {"conversations": [{"from": "user", "value": "hi"}, {"from": "assistant", "value": "yo"}]}
    extract_share = text_extractor(
        fields=None, chat_template="tokenizer", chat_renderer=render, messages_field="conversations"
    )
    plain = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    assert extract_share(share, 0) == extract(plain, 0) == "<s>[user] hi [/user]\n[assistant] yo [/assistant]\n"


def test_a_tokenizer_without_a_template_is_refused_naming_it(tmp_path: Path, bpe_tokenizer_json: Path) -> None:
    with pytest.raises(RequestError) as file_only:
        tokenizer_chat_renderer(bpe_tokenizer_json)
    assert file_only.value.field == "--tokenizer" and "--chat-template chatml" in str(file_only.value)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "tokenizer.json").write_bytes(bpe_tokenizer_json.read_bytes())
    (bare / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast"}')
    with pytest.raises(RequestError) as no_template:
        tokenizer_chat_renderer(bare)
    assert no_template.value.field == "--tokenizer" and "has no chat template" in str(no_template.value)

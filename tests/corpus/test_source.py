"""SFT data as token ids for the loader: chats through the tokenizer's own apply_chat_template, files or a
Hugging Face ``datasets`` dataset, and exactly the lengths ``skrull lengths`` counts for the same data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skrull.corpus.source import load_token_rows
from skrull.solver.errors import RequestError
from tests.cli.test_main import skrull
from tests.corpus.tiny import build_chat_tokenizer_dir, sample_texts


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_chat_tokenizer_dir(tmp_path_factory.mktemp("tok") / "chat-tokenizer")


def chats(n: int) -> list[dict[str, object]]:
    texts = sample_texts(n, seed=4)
    return [
        {"messages": [{"role": "user", "content": t[:30]}, {"role": "assistant", "content": t}], "id": k}
        for k, t in enumerate(texts)
    ]


def test_chat_rows_are_the_tokenizers_own_template_tokenized(tmp_path: Path, tokenizer_dir: Path) -> None:
    from transformers import AutoTokenizer

    rows = chats(23)
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = load_token_rows(tokenizer=tokenizer_dir, files=[data])
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    want = [list(tok.apply_chat_template(r["messages"], tokenize=True, return_dict=True)["input_ids"]) for r in rows]
    assert [got[i]["input_ids"] for i in range(len(got))] == want
    # the lengths a plan is made from are the lengths `skrull lengths` counts for the same data
    out = skrull(
        "lengths", str(data), "--tokenizer", str(tokenizer_dir), "--global-batch-size", "4", "--dp", "2",
        "--cp", "2", "-o", str(tmp_path / "req.json"), "--lengths-out", str(tmp_path / "lengths.json"),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "lengths.json").read_text()) == got.lengths == [len(w) for w in want]


def test_a_datasets_dataset_gives_the_same_rows_as_its_files(tmp_path: Path, tokenizer_dir: Path) -> None:
    import datasets

    rows = chats(17)
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    saved = tmp_path / "saved"
    datasets.Dataset.from_list(rows).save_to_disk(str(saved))
    from_files = load_token_rows(tokenizer=tokenizer_dir, files=[data])
    from_dataset = load_token_rows(tokenizer=tokenizer_dir, dataset=str(saved))
    assert [r["input_ids"] for r in from_dataset] == [r["input_ids"] for r in from_files]
    cut = load_token_rows(tokenizer=tokenizer_dir, dataset=str(saved), max_length=12)
    assert cut.lengths == [min(12, n) for n in from_files.lengths]


def test_a_source_names_what_is_wrong(tmp_path: Path, tokenizer_dir: Path) -> None:
    with pytest.raises(RequestError, match="give data files or --hub-dataset"):
        load_token_rows(tokenizer=tokenizer_dir)
    with pytest.raises(RequestError, match="no such file"):
        load_token_rows(tokenizer=tokenizer_dir, files=[tmp_path / "missing.jsonl"])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(RequestError, match="holds no rows"):
        load_token_rows(tokenizer=tokenizer_dir, files=[empty], fields=["text"])

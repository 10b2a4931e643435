"""Rows of a Hugging Face ``datasets`` dataset given by local path (offline: nothing is downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skrull.corpus.hub import iter_dataset_rows
from skrull.solver.errors import RequestError

ROWS = [{"text": "x" * (1 + k % 11), "n": k} for k in range(40)]


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))


def test_a_directory_of_jsonl_files_streams_its_rows_in_order(tmp_path: Path) -> None:
    data = tmp_path / "sft"
    data.mkdir()
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    got = list(iter_dataset_rows(str(data), split="train"))
    assert [row for row, _ in got] == ROWS
    assert [done for _, done in got] == list(range(1, len(ROWS) + 1))


def test_a_saved_dataset_is_read_with_load_from_disk(tmp_path: Path) -> None:
    import datasets

    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:7])}).save_to_disk(str(tmp_path / "saved"))
    assert [row for row, _ in iter_dataset_rows(str(tmp_path / "saved"), split="train")] == ROWS[:7]
    with pytest.raises(RequestError) as missing:
        list(iter_dataset_rows(str(tmp_path / "saved"), split="test"))
    assert (missing.value.field, missing.value.value) == ("--split", "test")


def test_an_unknown_split_or_dataset_is_one_error_naming_it(tmp_path: Path) -> None:
    data = tmp_path / "sft"
    data.mkdir()
    (data / "train.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    with pytest.raises(RequestError) as split:
        list(iter_dataset_rows(str(data), split="validation"))
    assert (split.value.field, split.value.value) == ("--split", "validation")
    with pytest.raises(RequestError) as nowhere:
        list(iter_dataset_rows(str(tmp_path / "no-such-dataset"), split="train"))
    assert nowhere.value.field == "--hub-dataset"

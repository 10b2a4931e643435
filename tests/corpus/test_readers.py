"""Rows streamed from JSONL, JSON arrays (across buffer boundaries) and Parquet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skrull.corpus import readers
from skrull.corpus.readers import iter_rows
from skrull.solver.errors import RequestError

ROWS = [{"text": "a" * (k % 37), "n": k} for k in range(300)]


def test_jsonl_rows_in_order_with_progress(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS) + "\n")
    got = list(iter_rows(path))
    assert [r for r, _ in got] == ROWS
    done = [d for _, d in got]
    assert done == sorted(done) and done[-1] <= path.stat().st_size


def test_json_array_streams_across_small_buffers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readers, "CHUNK_BYTES", 7)  # rows straddle many buffer refills
    path = tmp_path / "d.json"
    path.write_text(json.dumps(ROWS, indent=1))
    assert [r for r, _ in iter_rows(path)] == ROWS


def test_json_object_wrapping_one_list(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"version": 1, "data": ROWS[:5]}))
    assert [r for r, _ in iter_rows(path)] == ROWS[:5]


def test_parquet_record_batches(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path, row_group_size=64)
    assert [r for r, _ in iter_rows(path, columns=["text"])] == [{"text": r["text"]} for r in ROWS]


def test_rejects_a_missing_parquet_column(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS[:3]), path)
    with pytest.raises(RequestError, match="--field: 'prompt'"):
        list(iter_rows(path, columns=["prompt"]))


def test_rejects_malformed_lines_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(RequestError, match=r"d\.jsonl:2"):
        list(iter_rows(path))


def test_rejects_an_unclosed_json_array(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text('[{"text": "ok"}, {"text": "x"')
    with pytest.raises(RequestError, match="malformed JSON"):
        list(iter_rows(path))


def test_rejects_an_unknown_extension(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("text\n")
    with pytest.raises(RequestError, match="--format"):
        list(iter_rows(path))

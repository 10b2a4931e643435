"""Rows of SFT data files, streamed: memory stays bounded by one chunk whatever the file size.

- JSONL (``.jsonl``, ``.ndjson``): one JSON object per line, read line by line.
- JSON (``.json``): a top-level array of objects, decoded object by object from a sliding buffer
  (``json.JSONDecoder.raw_decode``), so a file larger than memory is not loaded whole. A top-level
  object holding one array (``{"data": [...]}``) is read whole (small files only).
- Parquet (``.parquet``): record batches of the needed columns through pyarrow.

Each reader yields ``(row, bytes_done)`` so a progress bar can follow the file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from skrull.solver.errors import RequestError

FORMATS: tuple[str, ...] = ("jsonl", "json", "parquet")
CHUNK_BYTES = 1 << 20


def detect_format(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if ".parquet" in suffixes:
        return "parquet"
    if suffixes and suffixes[-1] in (".jsonl", ".ndjson"):
        return "jsonl"
    if suffixes and suffixes[-1] == ".json":
        return "json"
    raise RequestError("DATA", str(path), f"unknown file type; give --format one of {', '.join(FORMATS)}")


def iter_files_rows(
    paths: Sequence[Path], *, fmt: str | None = None, columns: Sequence[str] | None = None
) -> Iterator[tuple[Any, int]]:
    """``iter_rows`` over several files in order, progress in bytes counted over all of them."""
    base = 0
    for path in paths:
        for row, done in iter_rows(path, fmt=fmt, columns=columns):
            yield row, base + done
        base += path.stat().st_size


def iter_rows(path: Path, *, fmt: str | None = None, columns: Sequence[str] | None = None) -> Iterator[tuple[Any, int]]:
    """``(row, bytes_done)`` for every row of ``path`` (``columns`` limits what Parquet reads)."""
    if not path.is_file():
        raise RequestError("DATA", str(path), "no such file")
    fmt = fmt or detect_format(path)
    if fmt == "jsonl":
        return _jsonl(path)
    if fmt == "json":
        return _json_array(path)
    if fmt == "parquet":
        return _parquet(path, columns)
    raise RequestError("--format", fmt, f"must be one of {', '.join(FORMATS)}")


def _jsonl(path: Path) -> Iterator[tuple[Any, int]]:
    done = 0
    with path.open("rb") as fh:
        for number, line in enumerate(fh, start=1):
            done += len(line)
            if not line.strip():
                continue
            try:
                yield json.loads(line), done
            except json.JSONDecodeError as exc:
                raise RequestError("DATA", f"{path}:{number}", f"not a JSON line ({exc.msg})") from None


def _json_array(path: Path) -> Iterator[tuple[Any, int]]:
    decoder = json.JSONDecoder()
    with path.open("r", encoding="utf-8") as fh:
        buf = fh.read(CHUNK_BYTES)
        pos = len(buf) - len(buf.lstrip())
        if buf[pos : pos + 1] == "{":  # an object wrapping one list of rows: read whole
            doc = json.loads(buf + fh.read())
            lists = [v for v in doc.values() if isinstance(v, list)] if isinstance(doc, dict) else []
            if len(lists) != 1:
                raise RequestError("DATA", str(path), "a JSON object must hold exactly one list of rows")
            size = path.stat().st_size
            for row in lists[0]:
                yield row, size
            return
        if buf[pos : pos + 1] != "[":
            raise RequestError("DATA", str(path), "JSON data must be an array of rows (or JSONL)")
        pos += 1
        consumed = 0  # characters dropped from the front of buf
        while True:
            while True:  # skip separators, refilling as needed
                while pos < len(buf) and buf[pos] in " \t\r\n,":
                    pos += 1
                if pos < len(buf):
                    break
                more = fh.read(CHUNK_BYTES)
                if not more:
                    raise RequestError("DATA", str(path), "the JSON array is not closed")
                consumed += pos
                buf, pos = more, 0
            if buf[pos] == "]":
                return
            while True:
                try:
                    row, end = decoder.raw_decode(buf, pos)
                    break
                except json.JSONDecodeError as exc:
                    more = fh.read(CHUNK_BYTES)
                    if not more:
                        raise RequestError(
                            "DATA", str(path), f"malformed JSON at character {consumed + exc.pos}"
                        ) from None
                    consumed += pos
                    buf, pos = buf[pos:] + more, 0
            yield row, consumed + end
            pos = end
            if pos > CHUNK_BYTES:  # keep the buffer bounded
                consumed += pos
                buf, pos = buf[pos:], 0


def _parquet(path: Path, columns: Sequence[str] | None) -> Iterator[tuple[Any, int]]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    names = set(pf.schema_arrow.names)
    wanted = [c for c in columns or () if c in names] or None
    missing = [c for c in columns or () if c not in names]
    if missing:
        raise RequestError("--field", missing[0], f"not a column of {path}; columns: {', '.join(sorted(names))}")
    total_rows = max(1, pf.metadata.num_rows)
    size = path.stat().st_size
    seen = 0
    for batch in pf.iter_batches(batch_size=4096, columns=wanted):
        for row in batch.to_pylist():
            seen += 1
            yield row, size * seen // total_rows

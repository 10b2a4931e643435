"""Token lengths of every row of one or more data files, and the planning request they make.

Rows are read streaming (corpus/readers.py), their texts batch-encoded ``batch_rows`` at a time
(corpus/tokenizer.py), so memory holds one batch of texts plus one integer per row. The request's
``batches`` are the lengths of the loader's global batches (corpus/order.py) in loader order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from skrull.corpus.order import global_batches
from skrull.corpus.progress import Progress
from skrull.corpus.readers import iter_rows
from skrull.corpus.tokenizer import LocalTokenizer
from skrull.solver.errors import RequestError

BATCH_ROWS = 2048


def count_lengths(
    paths: Sequence[Path],
    *,
    tokenizer: LocalTokenizer,
    extract: Callable[[Any, int], str],
    fmt: str | None = None,
    columns: Sequence[str] | None = None,
    max_length: int | None = None,
    batch_rows: int = BATCH_ROWS,
    progress: Progress | None = None,
) -> list[int]:
    """Tokens of every row, files in order (rows numbered from 0 over all files); ``max_length`` truncates."""

    def rows() -> Iterator[tuple[Any, int]]:
        base_bytes = 0
        for path in paths:
            for row, done in iter_rows(path, fmt=fmt, columns=columns):
                yield row, base_bytes + done
            base_bytes += path.stat().st_size

    return count_rows(
        rows(), tokenizer=tokenizer, extract=extract, max_length=max_length, batch_rows=batch_rows, progress=progress
    )


def count_rows(
    rows: Iterable[tuple[Any, int]],
    *,
    tokenizer: LocalTokenizer,
    extract: Callable[[Any, int], str],
    max_length: int | None = None,
    batch_rows: int = BATCH_ROWS,
    progress: Progress | None = None,
) -> list[int]:
    """Tokens of every ``(row, done)`` (``done``: progress in the unit ``progress`` counts, bytes or rows),
    encoded ``batch_rows`` texts at a time; ``max_length`` truncates."""
    lengths: list[int] = []
    texts: list[str] = []
    done = 0

    def flush() -> None:
        counts = tokenizer.count(texts)
        lengths.extend(min(n, max_length) if max_length else n for n in counts)
        texts.clear()

    for row, done in rows:
        texts.append(extract(row, len(lengths) + len(texts)))
        if len(texts) >= batch_rows:
            flush()
            if progress is not None:
                progress.update(done_bytes=done, rows=len(lengths), tokens=sum(lengths))
    if texts:
        flush()
    if progress is not None:
        done = max(done, progress.total_bytes or 0)
        progress.update(done_bytes=done, rows=len(lengths), tokens=sum(lengths), force=True)
        progress.close()
    return lengths


def lengths_request(
    lengths: Sequence[int],
    *,
    global_batch_size: int,
    seed: int,
    dp: int,
    cp: int,
    profile: Any,
    solver: str = "skrull",
    epoch: int = 0,
    shuffle: bool = True,
    drop_last: bool = True,
    max_batches: int | None = None,
    bucket_tokens: int | None = None,
    group_capacity_tokens: int | None = None,
) -> dict[str, Any]:
    """The request document of the loader's global batches (docs/formats.md "Request").

    A row longer than ``group_capacity_tokens`` (``cp * bucket``) cannot be placed by any planner: refused
    here naming the row, so the user can truncate (``--max-length``) or raise ``--cp``.
    """
    if not lengths:
        raise RequestError("DATA", 0, "no rows found")
    if any(n < 1 for n in lengths):
        row = next(k for k, n in enumerate(lengths) if n < 1)
        raise RequestError(f"row {row}", 0, "has no tokens; every sequence needs at least one")
    order = global_batches(
        len(lengths), global_batch_size=global_batch_size, seed=seed, epoch=epoch, shuffle=shuffle, drop_last=drop_last
    )
    if not order:
        raise RequestError(
            "--global-batch-size", global_batch_size, f"larger than the {len(lengths)} rows (no full batch)"
        )
    if max_batches is not None:
        order = order[:max_batches]
    if group_capacity_tokens is not None:
        for batch in order:
            for row in batch:
                if lengths[row] > group_capacity_tokens:
                    raise RequestError(
                        f"row {row}",
                        lengths[row],
                        f"tokens exceed cp * bucket_tokens = {group_capacity_tokens}; "
                        "truncate (--max-length) or raise --cp",
                    )
    doc: dict[str, Any] = {
        "batches": [[lengths[row] for row in batch] for batch in order],
        "parallel": {"dp": dp, "cp": cp},
        "profile": profile,
        "solver": solver,
    }
    if bucket_tokens is not None:
        doc["bucket_tokens"] = bucket_tokens
    return doc

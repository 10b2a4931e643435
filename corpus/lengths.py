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
from skrull.corpus.readers import iter_files_rows
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
    return count_rows(
        iter_files_rows(paths, fmt=fmt, columns=columns),
        tokenizer=tokenizer,
        extract=extract,
        max_length=max_length,
        batch_rows=batch_rows,
        progress=progress,
    )


def encode_rows(
    rows: Iterable[tuple[Any, int]],
    *,
    tokenizer: LocalTokenizer,
    extract: Callable[[Any, int], str],
    max_length: int | None = None,
    batch_rows: int = BATCH_ROWS,
    progress: Progress | None = None,
) -> Iterator[list[int]]:
    """The token ids of every ``(row, done)`` in order (``done``: progress in the unit ``progress`` counts,
    bytes or rows), encoded ``batch_rows`` texts at a time; ``max_length`` truncates. What ``skrull lengths``
    counts and what the loader trains on come from here."""
    texts: list[str] = []
    num_rows = num_tokens = done = 0
    for row, done in rows:
        texts.append(extract(row, num_rows + len(texts)))
        if len(texts) < batch_rows:
            continue
        for ids in tokenizer.encode(texts):
            cut = ids[:max_length] if max_length else ids
            num_rows, num_tokens = num_rows + 1, num_tokens + len(cut)
            yield cut
        texts.clear()
        if progress is not None:
            progress.count(done=done, rows=num_rows, tokens=num_tokens)
    for ids in tokenizer.encode(texts) if texts else ():
        cut = ids[:max_length] if max_length else ids
        num_rows, num_tokens = num_rows + 1, num_tokens + len(cut)
        yield cut
    if progress is not None:
        done = max(done, progress.total or 0)
        progress.count(done=done, rows=num_rows, tokens=num_tokens, force=True)
        progress.close()


def count_rows(
    rows: Iterable[tuple[Any, int]],
    *,
    tokenizer: LocalTokenizer,
    extract: Callable[[Any, int], str],
    max_length: int | None = None,
    batch_rows: int = BATCH_ROWS,
    progress: Progress | None = None,
) -> list[int]:
    """The token count of every row (``encode_rows``)."""
    return [
        len(ids)
        for ids in encode_rows(
            rows, tokenizer=tokenizer, extract=extract, max_length=max_length, batch_rows=batch_rows, progress=progress
        )
    ]


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

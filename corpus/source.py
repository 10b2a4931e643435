"""SFT data as token ids: one place that decides where rows come from, what of a row is text and how it is
tokenized, for ``skrull lengths`` (which counts) and the planned loader (which trains).

A source is data files (JSON lines, a JSON array, Parquet: corpus/readers.py) or a Hugging Face
``datasets`` dataset by name or local path (corpus/hub.py). A row's text is its ``fields`` joined, or its
chat (``messages_field``) rendered with the tokenizer's own template through ``apply_chat_template``
(corpus/chat_template.py; the default for chat rows) or one of the fixed layouts (corpus/text.py). The
tokenizer is local (corpus/tokenizer.py). ``TokenizedRows`` holds every row's ids, and its ``lengths``
are exactly what ``skrull lengths`` counts for the same options, so a plan made from those lengths fits
the data the loader hands over (``skrull.worker.dataloader.PlannedBatches``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skrull.corpus.chat_template import tokenizer_chat_renderer
from skrull.corpus.hub import iter_dataset_rows
from skrull.corpus.lengths import encode_rows
from skrull.corpus.readers import iter_files_rows, iter_rows
from skrull.corpus.text import TOKENIZER_TEMPLATE, text_extractor
from skrull.corpus.tokenizer import LocalTokenizer, load_tokenizer
from skrull.solver.errors import RequestError


@dataclass(frozen=True, slots=True, kw_only=True)
class TextSource:
    """Rows (``rows()`` starts a new pass: ``(row, progress)`` pairs), each row's text, and the tokenizer.
    ``progress_unit`` is what ``progress`` counts: bytes of the files, or rows of a dataset."""

    rows: Callable[[], Iterator[tuple[Any, int]]]
    extract: Callable[[Any, int], str]
    tokenizer: LocalTokenizer
    chat_template: str | None
    progress_unit: str
    total_bytes: int | None


def open_text_source(
    *,
    tokenizer: str | Path,
    files: Sequence[str | Path] = (),
    dataset: str | None = None,
    split: str = "train",
    dataset_config: str | None = None,
    fmt: str | None = None,
    fields: Sequence[str] | None = None,
    chat_template: str | None = None,
    messages_field: str = "messages",
    add_special_tokens: bool = True,
    tiktoken_pattern: str | None = None,
) -> TextSource:
    """The source ``skrull lengths`` and the loader read (module doc). Chat rows (a list under
    ``messages_field`` in the first row) get the tokenizer's own template unless ``fields`` or
    ``chat_template`` say otherwise."""
    paths = [Path(f) for f in files]
    if bool(paths) == bool(dataset):
        raise RequestError(
            "DATA", [str(p) for p in paths], "give data files or --hub-dataset NAME_OR_PATH (one of the two)"
        )
    for path in paths:
        if not path.is_file():
            raise RequestError("DATA", str(path), "no such file")

    def first_rows() -> Iterator[tuple[Any, int]]:
        if dataset:
            return iter_dataset_rows(dataset, split=split, config=dataset_config)
        return iter_rows(paths[0], fmt=fmt)

    template = chat_template
    if template is None and not fields:
        first = next(first_rows(), (None, 0))[0]
        if isinstance(first, dict) and isinstance(first.get(messages_field), list):
            template = TOKENIZER_TEMPLATE  # chat rows: the model's own template
    renderer = tokenizer_chat_renderer(tokenizer) if template == TOKENIZER_TEMPLATE else None
    extract = text_extractor(
        fields=fields, chat_template=template, messages_field=messages_field, chat_renderer=renderer
    )
    local = load_tokenizer(
        tokenizer,
        # the template writes the special tokens it wants; added again they would be counted twice
        add_special_tokens=add_special_tokens and renderer is None,
        tiktoken_pattern=tiktoken_pattern,
    )
    columns = [messages_field] if template else list(fields or ["text"])

    def rows() -> Iterator[tuple[Any, int]]:
        if dataset:
            return iter_dataset_rows(dataset, split=split, config=dataset_config)
        return iter_files_rows(paths, fmt=fmt, columns=columns)

    return TextSource(
        rows=rows,
        extract=extract,
        tokenizer=local,
        chat_template=template,
        progress_unit="rows" if dataset else "B",
        total_bytes=None if dataset else sum(p.stat().st_size for p in paths),
    )


class TokenizedRows(Sequence[dict[str, list[int]]]):
    """Every row's token ids, in source order: ``rows[i] == {"input_ids": [...]}`` (what
    ``PlannedBatches`` reads; labels are the next tokens), and ``lengths``, one per row."""

    def __init__(self, ids: Sequence[Sequence[int]]) -> None:
        self._ids = [list(x) for x in ids]

    def __len__(self) -> int:
        return len(self._ids)

    def __getitem__(self, index: int) -> dict[str, list[int]]:  # type: ignore[override]
        return {"input_ids": self._ids[index]}

    @property
    def lengths(self) -> list[int]:
        return [len(x) for x in self._ids]


def tokenize_source(source: TextSource, *, max_length: int | None = None) -> TokenizedRows:
    """Every row of ``source`` as token ids, cut to ``max_length`` (as ``skrull lengths --max-length``)."""
    if max_length is not None and max_length < 1:
        raise RequestError("max_length", max_length, "must be an integer >= 1")
    ids = [
        list(row)
        for row in encode_rows(source.rows(), tokenizer=source.tokenizer, extract=source.extract, max_length=max_length)
    ]
    if not ids:
        raise RequestError("DATA", None, "holds no rows")
    return TokenizedRows(ids)


def load_token_rows(
    *,
    tokenizer: str | Path,
    files: Sequence[str | Path] = (),
    dataset: str | None = None,
    max_length: int | None = None,
    **options: Any,
) -> TokenizedRows:
    """``tokenize_source(open_text_source(...))``: data files or a ``datasets`` dataset as token ids."""
    source = open_text_source(tokenizer=tokenizer, files=files, dataset=dataset, **options)
    return tokenize_source(source, max_length=max_length)

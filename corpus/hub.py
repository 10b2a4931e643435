"""Rows of a Hugging Face ``datasets`` dataset: a dataset name, or a local path (a directory of data files,
a loading script's directory, or one saved with ``save_to_disk``).

Named datasets are streamed (``streaming=True``), so no whole download is needed before the first count;
a local directory is read by ``load_dataset`` with the builder its files call for (JSON lines, Parquet,
CSV ...), and a ``save_to_disk`` directory with ``load_from_disk``. Each row is yielded with the number
of rows read so far (a stream's size in bytes is not known in advance).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from skrull.solver.errors import RequestError

#: Files ``save_to_disk`` writes: a directory holding one is read with ``load_from_disk``.
SAVED_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")


def iter_dataset_rows(name: str, *, split: str = "train", config: str | None = None) -> Iterator[tuple[Any, int]]:
    """``(row, rows_done)`` for every row of ``split`` of the dataset ``name`` (a name or a local path)."""
    try:
        import datasets
    except ImportError as exc:
        raise RequestError(
            "--hub-dataset", name, f"needs the datasets package (pip install 'skrull[data]'): {exc}"
        ) from None
    local = Path(name)
    try:
        if local.is_dir() and any((local / marker).is_file() for marker in SAVED_MARKERS[1:]):
            saved = datasets.load_from_disk(str(local))
            rows: Any = saved[split] if isinstance(saved, datasets.DatasetDict) else saved
        else:
            rows = datasets.load_dataset(name, config, split=split, streaming=True)
    except KeyError:
        raise RequestError("--split", split, f"not a split of {name}") from None
    except (FileNotFoundError, ValueError, datasets.exceptions.DatasetNotFoundError) as exc:
        reason = " ".join(str(exc).split())
        if isinstance(exc, ValueError) and ("Bad split" in reason or "Unknown split" in reason):
            raise RequestError("--split", split, f"not a split of {name} ({reason})") from None
        raise RequestError("--hub-dataset", name, f"cannot be loaded ({reason})") from None
    for done, row in enumerate(rows, start=1):
        yield row, done

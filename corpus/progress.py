"""Progress of a long count on stderr, drawn by tqdm: rows and tokens so far over the bytes (or rows) read.

tqdm draws only on a terminal by default (``enabled=None``), so piped or captured output stays clean;
``enabled=True`` forces the bar (tests), ``False`` silences it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from tqdm import tqdm

MIN_INTERVAL_S = 0.1


class Progress:
    def __init__(
        self,
        *,
        total_bytes: int | None,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        unit: str = "B",
        desc: str = "counting tokens",
    ) -> None:
        from tqdm import tqdm  # the data extra's; the CLI imports this module whatever is installed

        self.total_bytes = total_bytes
        self._done = 0
        self.bar: tqdm[Any] = tqdm(
            total=total_bytes,
            desc=desc,
            unit=unit,
            unit_scale=unit == "B",
            unit_divisor=1024 if unit == "B" else 1000,
            file=stream or sys.stderr,
            disable=None if enabled is None else not enabled,
            mininterval=MIN_INTERVAL_S,
            dynamic_ncols=True,
        )

    def update(self, *, done_bytes: int, rows: int, tokens: int, force: bool = False) -> None:
        """``done_bytes``: how far the reading is, in the bar's unit (bytes of files, or rows)."""
        if done_bytes > self._done:
            self.bar.update(done_bytes - self._done)
            self._done = done_bytes
        self.bar.set_postfix(rows=rows, tokens=tokens, refresh=force)

    def close(self) -> None:
        self.bar.close()

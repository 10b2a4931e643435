"""The one progress bar of the long commands: a tqdm bar on stderr, so stdout stays the report.

``skrull lengths`` counts rows and tokens over the bytes (or rows) it reads (``Progress.count``); the worker's
commands (``skrull finetune``, ``skrull execute``, ``skrull profile``) step through phases and units
(``set_postfix_str``, ``update``; worker/progress.py chooses between this bar and one line per phase). tqdm
draws only on a terminal by default (``enabled=None``), so piped or captured output stays clean;
``enabled=True`` forces the bar (tests), ``False`` silences it. tqdm is imported when a bar is made (the
``data`` and ``worker`` extras carry it; the CLI imports this module whatever is installed).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from tqdm import tqdm

MIN_INTERVAL_S = 0.1


class Progress:
    """A tqdm bar on ``stream`` (stderr) of ``total`` ``unit``s (None: unknown); byte counts (``unit="B"``)
    are shown scaled by 1024."""

    def __init__(
        self,
        *,
        total: int | None,
        desc: str = "counting tokens",
        unit: str = "B",
        enabled: bool | None = None,
        stream: TextIO | None = None,
    ) -> None:
        from tqdm import tqdm

        self.total = total
        self._done = 0
        self.bar: tqdm[Any] = tqdm(
            total=total,
            desc=desc,
            unit=unit,
            unit_scale=unit == "B",
            unit_divisor=1024 if unit == "B" else 1000,
            file=stream or sys.stderr,
            disable=None if enabled is None else not enabled,
            mininterval=MIN_INTERVAL_S,
            dynamic_ncols=True,
        )

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        """What the bar is doing (``refresh``: drawn now)."""
        self.bar.set_postfix_str(s, refresh=refresh)

    def update(self, n: float | None = 1) -> bool | None:
        """``n`` more units done."""
        return self.bar.update(n)

    def count(self, *, done: int, rows: int, tokens: int, force: bool = False) -> None:
        """A count so far: ``done`` is how far the reading is, in the bar's unit (bytes of files, or rows)."""
        if done > self._done:
            self.bar.update(done - self._done)
            self._done = done
        self.bar.set_postfix(rows=rows, tokens=tokens, refresh=force)

    def close(self) -> None:
        self.bar.close()

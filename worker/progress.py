"""Progress of the worker's long commands (``skrull finetune``, ``skrull execute``, ``skrull profile``) on
stderr, so stdout stays the report.

On a terminal, the one tqdm bar of the long commands (``corpus.progress.Progress``) redrawn in place; anywhere
else (a pipe, a CI log, ``| tee``) a bar's carriage returns would arrive as one line at the end, so progress
is one flushed line per phase instead (``PhaseLines``): a run that takes minutes says what it is doing from
its first second. ``enabled=None`` chooses by the terminal test, ``True`` always draws the bar, ``False``
prints nothing.
"""

from __future__ import annotations

import sys

from skrull.corpus.progress import Progress as Progress


class PhaseLines:
    """``Progress``'s ``set_postfix_str`` / ``update`` / ``close``, written as lines: ``set_postfix_str(s)``
    with ``refresh=True`` announces a phase (``"<desc>: <s>"``); ``update()`` after a ``refresh=False`` postfix
    reports a finished unit with its count (``"<desc>: [3/6] step 0: loss 5.1"``). Each line is
    flushed at once."""

    def __init__(self, *, total: int, desc: str, unit: str) -> None:
        self.total = total
        self.desc = desc
        self.unit = unit
        self.n = 0
        self._pending: str | None = None

    def _say(self, text: str) -> None:
        print(f"{self.desc}: {text}", file=sys.stderr, flush=True)

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        if refresh:
            self._pending = None
            self._say(s)
        else:
            self._pending = s

    def update(self, n: float | None = 1) -> bool | None:
        self.n += int(n or 0)
        if self._pending is not None:
            self._say(f"[{self.n}/{self.total}] {self._pending}")
            self._pending = None
        return None

    def close(self) -> None:
        self._pending = None


def on_terminal() -> bool:
    return sys.stderr.isatty()


def progress_bar(*, total: int, desc: str, unit: str, enabled: bool | None) -> Progress | PhaseLines:
    """The bar (``enabled=True``, or ``None`` on a terminal), phase lines (``None`` elsewhere), or a disabled
    bar (``False``)."""
    if enabled is None and not on_terminal():
        return PhaseLines(total=total, desc=desc, unit=unit)
    return Progress(total=total, desc=desc, unit=unit, enabled=enabled is not False)

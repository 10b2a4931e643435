"""A one-line progress bar on a terminal's stderr (nothing at all when stderr is not a TTY)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

WIDTH = 30
MIN_INTERVAL_S = 0.1


class Progress:
    def __init__(self, *, total_bytes: int, stream: TextIO | None = None, enabled: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.total_bytes = max(1, total_bytes)
        self.start = time.perf_counter()
        self._last = 0.0

    def update(self, *, done_bytes: int, rows: int, tokens: int, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if not force and now - self._last < MIN_INTERVAL_S:
            return
        self._last = now
        frac = min(1.0, done_bytes / self.total_bytes)
        filled = int(WIDTH * frac)
        rate = done_bytes / 2**20 / max(now - self.start, 1e-9)
        self.stream.write(
            f"\r[{'#' * filled}{'.' * (WIDTH - filled)}] {100 * frac:5.1f}%  "
            f"{rows} rows  {tokens} tokens  {rate:.1f} MB/s"
        )
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()

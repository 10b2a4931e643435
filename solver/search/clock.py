"""Clocks for the search: the wall clock, or a work clock that makes ``auto`` deterministic.

The search reads its clock before every costly step and stops at its deadline. With
``time.monotonic`` the amount of search done depends on the machine and its load; a ``WorkClock``
advances by ``tick_s`` at every reading instead, so the same request reads the same sequence of times,
takes the same steps and returns the same plan on any machine (``"deterministic": true``). Its ticks
are calibrated so that a deterministic search takes about its budget on an idle core; on a loaded one
it takes longer (the budget is then a measure of work, not of wall time).
"""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]

#: Seconds a work clock advances per reading (about one placement of a 256-sequence search).
TICK_S = 1e-4


class WorkClock:
    """A deterministic clock: every call returns the previous reading plus ``tick_s``."""

    def __init__(self, start: float = 0.0, tick_s: float = TICK_S) -> None:
        self._now = start
        self.tick_s = tick_s

    def __call__(self) -> float:
        self._now += self.tick_s
        return self._now


def clock_for(deterministic: bool) -> Clock:
    return WorkClock() if deterministic else time.monotonic

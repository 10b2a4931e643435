"""What a backend returns: the status, the best assignment found and the proven bound (model units)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

#: Seconds a backend stops before its deadline, for decoding and returning its answer.
STOP_MARGIN_S = 0.05

#: Called with (variable values, objective, bound) whenever a backend finds a better solution.
IncumbentCallback = Callable[[list[int], int, int | None], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendResult:
    """``status``: "optimal" (proven), "feasible" (stopped with a solution), "infeasible", "unknown"."""

    status: str
    values: list[int] | None
    objective: int | None
    bound: int | None

"""Budgets as promises: the smallest ``time_budget_s`` each planner can keep, and the early refusal.

A planner's solve (planning, estimating and validating the plan: ``planning.solve``) takes about
``fixed_s + per_sequence_s * K + per_square_s * sum_b K_b^2`` for K sequences in batches of K_b; the
constants below are measured on a loaded 2-core machine and doubled. Planners that search (``auto``,
``ilp``, ``hydraulis``'s stage-2 ILP) scale their work to the budget, so for them this is only what
their first constructive step and the final checks need. A request whose budget is below the figure is
refused before any work, with a ``RequestError`` naming ``time_budget_s`` and the smallest budget that
can work (the service answers 422), instead of overrunning its budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from skrull.solver.errors import RequestError

#: Estimating and validating a plan, per sequence (measured 1.2 us on one core; doubled).
FINISH_PER_SEQUENCE_S = 2.5e-6
#: Headroom over the measured cost, for a loaded machine.
SAFETY = 2.0


@dataclass(frozen=True, slots=True)
class Cost:
    fixed_s: float
    per_sequence_s: float
    per_square_s: float = 0.0

    def seconds(self, batch_sizes: Sequence[int]) -> float:
        num = sum(batch_sizes)
        squares = sum(b * b for b in batch_sizes)
        return self.fixed_s + self.per_sequence_s * num + self.per_square_s * squares + FINISH_PER_SEQUENCE_S * num


#: Measured single-run costs (before SAFETY) of each planner's unavoidable work.
COSTS: dict[str, Cost] = {
    "auto": Cost(0.004, 1e-6),  # the ``packed`` start, then it stops at its deadline
    "packed": Cost(0.001, 1e-6),
    "deepspeed": Cost(0.001, 1e-6),
    "sorted": Cost(0.001, 2e-6),
    "skrull": Cost(0.002, 1e-5),
    "round-robin": Cost(0.002, 1e-5),
    "verl-kk": Cost(0.002, 5e-6, 1.5e-8),
    "ilp": Cost(0.06, 2e-5),  # the ``skrull`` start, a forked solver process building its model
    "ilp-flex": Cost(0.03, 1e-5),  # ``auto``'s start and a forked solver process
    "hydraulis": Cost(0.01, 2e-4),
    "dynamic-cp": Cost(0.005, 2.5e-4),
    "wlb": Cost(0.005, 1.5e-4),
    "wlb-keep": Cost(0.005, 1.2e-4),  # auto's start: wlb without the outlier queues (no queue search)
}


def smallest_budget_s(solver: str, batch_sizes: Sequence[int]) -> float:
    """The smallest ``time_budget_s`` ``solver`` keeps for batches of these sizes (unknown: 0)."""
    cost = COSTS.get(solver)
    return 0.0 if cost is None else SAFETY * cost.seconds(batch_sizes)


def check_budget(solver: str, batch_sizes: Sequence[int], time_budget_s: float) -> None:
    """Refuse, before any work, a budget the planner cannot keep."""
    need = smallest_budget_s(solver, batch_sizes)
    if time_budget_s < need:
        raise RequestError(
            "time_budget_s",
            time_budget_s,
            f"{solver!r} needs at least {_round_up(need)} s for {sum(batch_sizes)} sequences "
            f"in {len(batch_sizes)} batches; ask for time_budget_s >= {_round_up(need)}",
        )


def _round_up(seconds: float) -> float:
    """Two significant digits, rounded up (so the figure quoted always works)."""
    if seconds <= 0:
        return 0.0
    factor = 10.0 ** (1 - math.floor(math.log10(seconds)))
    return math.ceil(seconds * factor) / factor

"""What a search keeps back of its budget to finish: estimating and validating the plan it returns.

``auto``, ``ilp`` and deferral (solver/defer.py) stop searching early enough to price and check their plan
within the budget: ``FINISH_RESERVE_PER_SEQUENCE_S`` per sequence and ``microbatch_reserve_s`` for the
microbatches of the plan it may return.

The budget rule itself (the smallest budget a planner keeps, a request's default, the early refusal) is
``solver.budget``; its names, once here, are still read from this module, with a ``DeprecationWarning``.
They are looked up when first read (``importlib``, not an import: the rule imports this module, through the
planners, and no module of the library reads a deprecated name).
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

#: What a searching planner keeps back of its budget per sequence to finish (estimate and validate): 3.9 us
#: measured for 65,536 ShareGPT sequences on Qwen2.5-7B's profile (many small microbatches).
FINISH_RESERVE_PER_SEQUENCE_S = 4e-6
#: And per microbatch of the plan, on top: estimating and validating 65,536 Mooncake sequences on DP64 x CP8
#: (Qwen2.5-0.5B) took 0.50 s with Skrull's 26,929 microbatches and 0.83 s with one sequence per microbatch
#: (ShareGPT, 960 microbatches: 0.12 s), about 2 us per sequence and 10.6 us per microbatch; a search that
#: kept back the per-sequence share alone ran 0.25 s past a 10 s budget.
FINISH_RESERVE_PER_MICROBATCH_S = 1.1e-5
#: The most a plan's microbatch count is taken to grow in a local search (its merges and moves rarely split).
MICROBATCH_GROWTH = 1.25


def microbatch_reserve_s(num_microbatches: int) -> float:
    """Seconds a searching planner keeps back for estimating and validating a plan searched from one of
    ``num_microbatches``: ``FINISH_RESERVE_PER_MICROBATCH_S * MICROBATCH_GROWTH`` each."""
    return FINISH_RESERVE_PER_MICROBATCH_S * MICROBATCH_GROWTH * num_microbatches


#: Names that moved to ``solver.budget`` (deprecated here).
MOVED = frozenset(
    {
        "COSTS",
        "Cost",
        "DEFAULT_TIME_BUDGET_S",
        "EXACT_DEFAULT_TIME_BUDGET_S",
        "EXACT_SOLVERS",
        "FINISH_PER_SEQUENCE_S",
        "MAX_DEFAULT_TIME_BUDGET_S",
        "SAFETY",
        "batch_needs_s",
        "batch_share_s",
        "check_budget",
        "default_budget_s",
        "estimated_s",
        "plans_batch_by_batch",
        "smallest_budget_s",
    }
)


def __getattr__(name: str) -> Any:
    """A moved name, read from ``solver.budget`` with a ``DeprecationWarning`` (PEP 562)."""
    if name not in MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"skrull.solver.search.budget.{name} moved to skrull.solver.budget.{name}", DeprecationWarning, stacklevel=2
    )
    return getattr(importlib.import_module("skrull.solver.budget"), name)

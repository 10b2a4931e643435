"""Deprecated: the planner process now lives in the package worker/planner/, one module per concern.

``skrull.worker.planner.server`` (the process), ``skrull.worker.planner.client`` (``ProcessPlans``) and
``skrull.worker.planner.budget`` (``PlanningBudget``, ``unagreed_budget_s``). This module keeps the names
users and tests imported from here importable, with a ``DeprecationWarning`` naming the new module, and
still runs the process as ``python -m skrull.worker.planner_process``.
"""

from __future__ import annotations

import warnings

from skrull.worker.planner.budget import PlanningBudget, unagreed_budget_s
from skrull.worker.planner.client import PlannerError, ProcessPlans
from skrull.worker.planner.server import DRAIN_GRACE_S, Planner, main, serve
from skrull.worker.planner.wire import MAX_MESSAGE_BYTES

__all__ = [
    "DRAIN_GRACE_S",
    "MAX_MESSAGE_BYTES",
    "Planner",
    "PlannerError",
    "PlanningBudget",
    "ProcessPlans",
    "main",
    "serve",
    "unagreed_budget_s",
]

if __name__ == "__main__":
    main()
else:
    warnings.warn(
        "skrull.worker.planner_process is deprecated: import from skrull.worker.planner.client (ProcessPlans, "
        "PlannerError), skrull.worker.planner.budget (PlanningBudget, unagreed_budget_s) or "
        "skrull.worker.planner.server (Planner, serve, main), "
        "skrull.worker.planner.wire (MAX_MESSAGE_BYTES)",
        DeprecationWarning,
        stacklevel=2,
    )

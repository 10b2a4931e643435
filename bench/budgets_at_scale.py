"""Budgets kept at the largest group: each planner on 12 sequences over DP1 x CP65,536 with a 5 s budget,
its wall time against the budget (issue figures: ilp-flex still running after 90 s, hydraulis 11.6 s).

    PYTHONPATH=$PWD python bench/budgets_at_scale.py [--solvers hydraulis,ilp-flex] [--budget 5]

Prints one line per planner; asserts nothing (tests/solver/planners/test_hydraulis.py and
tests/solver/ilp/test_builder.py test the two causes that were found).
"""

from __future__ import annotations

import argparse
import os
import time

from skrull.solver.errors import SkrullError
from skrull.solver.io import request_from_dict
from skrull.solver.planning import solve

LENGTHS = [60_000, 1_000, 2_000, 500_000, 7_000, 30_000] * 2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--solvers", default="hydraulis,ilp-flex")
    parser.add_argument("--budget", type=float, default=5.0)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    for solver in args.solvers.split(","):
        doc = {
            "batches": [LENGTHS],
            "parallel": {"dp": 1, "cp": 65_536},
            "solver": solver,
            "time_budget_s": args.budget,
        }
        start = time.perf_counter()
        try:
            plan = solve(request_from_dict(doc))
            outcome = f"{plan.solve.status}, {plan.estimated_ms:.1f} ms estimated"
        except SkrullError as exc:
            outcome = f"refused: {exc}"
        print(f"{solver}: {time.perf_counter() - start:.2f} s for a {args.budget:g} s budget ({outcome})")


if __name__ == "__main__":
    main()

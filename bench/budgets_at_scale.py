"""Budgets kept at the largest group: each planner on 12 sequences over DP1 x CP65,536 with a 5 s budget,
its wall time against the budget (issue figures: ilp-flex still running after 90 s, hydraulis 11.6 s);
then ``auto`` on many sequences over one wide group, 4,096 ``mooncake`` sequences over DP1 x CP1,024 with
a 3 s budget, ``--repeats`` fresh draws (one placement of ~1,700 of them took 0.52 s and ran ``auto``
0.3 s past its budget before placements gave up at their search's deadline).

    PYTHONPATH=$PWD python bench/budgets_at_scale.py [--solvers hydraulis,ilp-flex] [--budget 5] [--repeats 5]

Prints one line per planner; asserts nothing (tests/solver/planners/test_hydraulis.py and
tests/solver/ilp/test_builder.py test the two causes that were found).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

from skrull.solver.errors import SkrullError
from skrull.solver.io import DEFAULT_PROFILE, request_from_dict
from skrull.solver.lengths.datasets import synthesize_request
from skrull.solver.planning import solve
from skrull.solver.profile import load_profile
from skrull.solver.types import Parallel

LENGTHS = [60_000, 1_000, 2_000, 500_000, 7_000, 30_000] * 2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--solvers", default="hydraulis,ilp-flex")
    parser.add_argument("--budget", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=5, help="draws of the CP1,024 case (0: none)")
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
    walls = []
    for k in range(args.repeats):
        request = synthesize_request(
            dataset="mooncake", parallel=Parallel(dp=1, cp=1024), profile=load_profile(DEFAULT_PROFILE),
            sequences_per_rank=4096, seed=int(time.time()) + k,
        )  # fmt: skip
        start = time.perf_counter()
        solve(dataclasses.replace(request, solver="auto", time_budget_s=3.0))
        walls.append(time.perf_counter() - start)
    if walls:
        print(
            f"auto, 4,096 sequences over DP1 x CP1,024, 3 s budget: wall {min(walls):.2f}-{max(walls):.2f} s over "
            f"{len(walls)} draws (the promise: 3.15 s)"
        )


if __name__ == "__main__":
    main()

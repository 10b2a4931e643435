"""The up-front budget check against measured walls: for every planner and request shape (sequences, DP x
CP, batches), the raw estimate of ``solver.search.budget`` (the smallest accepted budget is SAFETY = 2 times
it) beside the measured wall of ``planning.solve``, given a generous budget (fixed-work planners) or exactly
the smallest accepted budget (planners that search: ``auto``, ``ilp``, ``ilp-flex``, ``hydraulis``; their
wall must then stay within that budget: they search until their deadline or a proof, so their estimate
is a floor, not a prediction). Target: estimate / measured within 0.5..2 for every fixed-work planner,
measured <= budget + max(20 ms, 5%) for the searching ones. Prints a Markdown table; asserts nothing.
Run: python bench/budget_estimates.py
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import time

from skrull.solver.datasets import synthesize_request
from skrull.solver.planners.registry import planner_names
from skrull.solver.planning import solve
from skrull.solver.profile import load_profile
from skrull.solver.search.budget import estimated_s, smallest_budget_s
from skrull.solver.types import Parallel

SEARCHING = ("auto", "ilp", "ilp-flex", "hydraulis")


#: (sequences, dp, cp, batches): sizes, DP and CP degrees and batch splits the terms depend on.
SHAPES = [(1024, 4, 8, 1), (8192, 4, 8, 1), (8192, 64, 8, 1), (8192, 4, 8, 8), (1024, 4, 64, 1), (16384, 2, 8, 1)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--solvers", default=",".join(n for n in planner_names()))
    args = parser.parse_args()
    profile = load_profile("h100-80g/qwen2.5-0.5b")
    print(f"machine: {platform.machine()} python {platform.python_version()}\n")
    print("| planner | sequences | dp x cp | batches | estimate s | budget s | measured s | estimate / measured |")
    print("|---|---|---|---|---|---|---|---|")
    for solver in args.solvers.split(","):
        for size, dp, cp, batches in SHAPES:
            base = synthesize_request(
                dataset="llama3-sft-mix",
                parallel=Parallel(dp=dp, cp=cp),
                profile=profile,
                sequences_per_rank=size // dp // batches,
                num_batches=batches,
                seed=3,
                solver=solver,
            )
            sizes = [len(b) for b in base.batches]
            estimate = estimated_s(solver, sizes, base.parallel)
            budget = smallest_budget_s(solver, sizes, base.parallel) if solver in SEARCHING else 600.0
            request = dataclasses.replace(base, time_budget_s=max(budget, 0.05))
            start = time.perf_counter()
            solve(request)
            measured = time.perf_counter() - start
            print(
                f"| {solver} | {size} | {dp} x {cp} | {batches} | {estimate:.3f} | {request.time_budget_s:.3f} "
                f"| {measured:.3f} "
                f"| {estimate / measured:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()

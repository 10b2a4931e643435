"""The up-front budget check against measured walls: for every planner and a range of request sizes, the
smallest budget ``solver.search.budget`` would accept (its estimate, SAFETY included) beside the measured
wall of ``planning.solve`` given a generous budget (fixed-work planners) or exactly that smallest budget
(planners that search: ``auto``, ``ilp``, ``ilp-flex``, ``hydraulis``; their wall must then stay within it).
Target: estimate / measured within 0.5..2 for every fixed-work planner, and measured <= estimate + 20 ms for
the searching ones. Prints a Markdown table; asserts nothing. Run: python bench/budget_estimates.py
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
from skrull.solver.search.budget import smallest_budget_s
from skrull.solver.types import Parallel

SEARCHING = ("auto", "ilp", "ilp-flex", "hydraulis")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="256,2048,8192")
    parser.add_argument("--solvers", default=",".join(n for n in planner_names()))
    args = parser.parse_args()
    profile = load_profile("h100-80g/qwen2.5-0.5b")
    print(f"machine: {platform.machine()} python {platform.python_version()}\n")
    print("| planner | sequences | estimate s | measured s | estimate / measured |")
    print("|---|---|---|---|---|")
    for solver in args.solvers.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            dp = max(1, size // 256)
            base = synthesize_request(
                dataset="llama3-sft-mix", parallel=Parallel(dp=dp, cp=8), profile=profile,
                sequences_per_rank=size // dp, seed=3, solver=solver,
            )
            estimate = smallest_budget_s(solver, [len(b) for b in base.batches])
            budget = max(estimate, 0.05) if solver in SEARCHING else 600.0
            request = dataclasses.replace(base, time_budget_s=budget)
            start = time.perf_counter()
            solve(request)
            measured = time.perf_counter() - start
            print(f"| {solver} | {size} | {estimate:.3f} | {measured:.3f} | {estimate / measured:.2f} |", flush=True)


if __name__ == "__main__":
    main()

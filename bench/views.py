"""Rank-view cost at scale: one GPU's part of a plan must cost what that GPU runs, not its group size.

For DP1 x CP N (N = 1,024, 4,096, 16,384) and one batch of 202 sequences (chatqa2-long-sft shapes, the
size the service was first found slow on), per planner: the plan's microbatches, ``validate_plan``'s
wall, the first ``plan_rank_view`` (which builds the iteration's index) and 64 further views of other
ranks. Targets (issue "served plans at scale"): at CP 1,024 the first view < 0.5 s and 64 further ones
< 1 s together. Prints a Markdown table; asserts nothing. Run: python bench/views.py [--cp 1024,4096]
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import time

from skrull.solver.lengths.datasets import synthesize_request
from skrull.solver.planning import solve
from skrull.solver.profile import load_profile
from skrull.solver.types import Parallel, Problem
from skrull.solver.validate import validate_plan
from skrull.solver.worker_view import plan_rank_view


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cp", default="1024,4096,16384")
    parser.add_argument("--solvers", default="skrull,packed,deepspeed,auto")
    parser.add_argument("--sequences", type=int, default=202)
    args = parser.parse_args()
    profile = load_profile("h100-80g/qwen2.5-0.5b")
    print(f"machine: {platform.machine()} python {platform.python_version()}, {args.sequences} sequences\n")
    print("| CP | planner | microbatches | validate ms | first view ms | 64 further views ms |")
    print("|---|---|---|---|---|---|")
    for cp in (int(c) for c in args.cp.split(",")):
        base = synthesize_request(
            dataset="chatqa2-long-sft",
            parallel=Parallel(dp=1, cp=cp),
            profile=profile,
            sequences_per_rank=args.sequences,
            seed=1,
        )
        lengths = Problem.from_request(base).lengths
        for solver in args.solvers.split(","):
            request = dataclasses.replace(base, solver=solver, time_budget_s=2.0)
            plan = solve(request)
            t0 = time.perf_counter()
            validate_plan(plan, request)
            t1 = time.perf_counter()
            plan_rank_view(plan, lengths, iteration=0, rank=cp // 2)
            t2 = time.perf_counter()
            for k in range(64):
                plan_rank_view(plan, lengths, iteration=0, rank=(k * 7919) % cp)
            t3 = time.perf_counter()
            count = len(plan.iterations[0].microbatches)
            print(
                f"| {cp} | {solver} | {count} | {1e3 * (t1 - t0):.0f} | {1e3 * (t2 - t1):.1f} | {1e3 * (t3 - t2):.1f} |"
            )


if __name__ == "__main__":
    main()

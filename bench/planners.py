"""Iteration time per planner on every bundled distribution, on the reference cost model.

Two setups from Skrull section 5.1: Qwen2.5-0.5B at <DP4, CP8, 64 sequences per rank> and Qwen2.5-7B at
<DP2, CP16, 40 per rank>. Each cell averages BATCHES global batches sampled with a fixed seed; ``auto``
gets BUDGET seconds per batch. A cell reads: mean ms per batch (mean ratio to the lower bound,
speedup over deepspeed).
Prints Markdown tables; asserts nothing. Run: python bench/planners.py [--batches N]
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import sys

from tqdm import tqdm

from skrull.solver.lengths.datasets import distribution_names, synthesize_request
from skrull.solver.planners.registry import planner_names
from skrull.solver.profile import load_profile
from skrull.solver.reports.compare import compare
from skrull.solver.types import Parallel

SETUPS = [
    ("h100-80g/qwen2.5-0.5b", Parallel(dp=4, cp=8), 64),
    ("h100-80g/qwen2.5-7b", Parallel(dp=2, cp=16), 40),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=float, default=10.0, help="auto's budget per batch, seconds")
    parser.add_argument("--solvers", default=None, help="comma-separated (default: all but ilp)")
    args = parser.parse_args()
    solvers = args.solvers.split(",") if args.solvers else [n for n in planner_names() if n != "ilp"]
    print(f"machine: {platform.machine()} {platform.processor() or ''} python {platform.python_version()}")
    for profile_name, parallel, per_rank in SETUPS:
        profile = load_profile(profile_name)
        print(
            f"\n## {profile_name}, DP{parallel.dp} x CP{parallel.cp}, {per_rank} sequences per rank, "
            f"bucket {profile.bucket_tokens}, mean of {args.batches} batches\n"
        )
        head = "| dataset | " + " | ".join(f"{s} ms (x bound, speedup)" for s in solvers) + " |"
        print(head)
        print("|" + "---|" * (len(solvers) + 1))
        for dataset in tqdm(
            distribution_names(),
            desc=f"{profile_name} DP{parallel.dp}xCP{parallel.cp}",
            file=sys.stderr,
            leave=False,
            disable=None,
        ):
            request = synthesize_request(
                dataset=dataset,
                parallel=parallel,
                profile=profile,
                sequences_per_rank=per_rank,
                num_batches=args.batches,
                seed=args.seed,
            )
            request = dataclasses.replace(request, time_budget_s=args.budget * args.batches)
            rows, plans = compare(request, solvers)
            cells = []
            for row in rows:
                plan = plans[row.solver]
                per_iter = [it.estimated_ms / it.lower_bound_ms for it in plan.iterations]
                cells.append(
                    f"{plan.estimated_ms / args.batches:.0f} ({statistics.mean(per_iter):.2f}, {row.speedup:.2f}x)"
                )
            print(f"| {dataset} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

"""What ``equal_microbatches`` costs: every planner on fresh requests, with and without equal counts.

Each run draws new requests (a seed from the clock unless ``--seed``), so the table is on requests no
planner was tuned on: for every bundled distribution and layout, one global batch per draw, each
planner's iteration time with ``equal_microbatches`` over its time without: the planner's plan, and the
same plan padded as ``equal_microbatches`` pads it (solver/equalize.py), both on the reference cost
model (the constraint changes nothing else, which tests/solver/test_equalize.py checks). The padding adds
``microbatch_ms`` per empty microbatch on GPUs that ran fewer than the iteration's most; the ratio is
``> 1`` only where such a GPU was the slowest.

    python bench/equal_microbatches.py [--draws 3] [--seed N] [--solvers a,b]
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import sys
import time

from tqdm import tqdm

from skrull.solver.cost import CostModel
from skrull.solver.equalize import equalize_microbatches
from skrull.solver.lengths.datasets import distribution_names, synthesize_request
from skrull.solver.planners.registry import planner_names
from skrull.solver.planning import solve
from skrull.solver.profile import load_profile
from skrull.solver.types import Iteration, MicrobatchSpec, Parallel, Problem

#: (profile, layout, sequences per DP rank)
SETUPS = (
    ("h100-80g/qwen2.5-0.5b", Parallel(dp=4, cp=8), 64),
    ("h100-80g/qwen2.5-7b", Parallel(dp=2, cp=16), 64),
)


def _specs(iteration: Iteration) -> list[MicrobatchSpec]:
    return [
        MicrobatchSpec(step=mb.step, ranks=mb.ranks, local=mb.local, sharded=mb.sharded, sharding=mb.sharding)
        for mb in iteration.microbatches
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--draws", type=int, default=3, help="requests per distribution and layout")
    parser.add_argument("--seed", type=int, default=None, help="default: from the clock (fresh requests)")
    parser.add_argument("--solvers", default=None, help="comma-separated (default: every planner but ilp-flex)")
    parser.add_argument("--budget", type=float, default=0.5, help="time_budget_s of the budgeted planners")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    solvers = args.solvers.split(",") if args.solvers else [n for n in planner_names() if n != "ilp-flex"]
    ratios: dict[str, list[float]] = {s: [] for s in solvers}
    jobs = [(p, par, per, d, k) for p, par, per in SETUPS for d in distribution_names() for k in range(args.draws)]
    for profile_name, parallel, per_rank, dataset, k in tqdm(jobs, file=sys.stderr, leave=False, disable=None):
        request = synthesize_request(
            dataset=dataset,
            parallel=parallel,
            profile=load_profile(profile_name),
            sequences_per_rank=per_rank,
            seed=seed * 1000 + k,
        )
        for solver in solvers:
            plain = dataclasses.replace(request, solver=solver, deterministic=True)
            if solver in ("auto", "ilp", "hydraulis"):
                plain = dataclasses.replace(plain, time_budget_s=args.budget)
            plan = solve(plain)
            # the constraint changes a plan only by its padding: price the same plan padded (planning it
            # again would compare two solves of a budgeted planner, not the constraint)
            model = CostModel(request.profile, bucket_tokens=request.bucket_tokens)
            lengths = Problem.from_request(request).lengths
            equal = sum(
                model.iteration_ms(equalize_microbatches(_specs(it), parallel), lengths, parallel.num_gpus)
                for it in plan.iterations
            )
            ratios[solver].append(equal / plan.estimated_ms)
    print(f"machine: {platform.machine()} python {platform.python_version()}; seed {seed}; {len(jobs)} requests")
    print("(each bundled distribution x the layouts below, one global batch each)\n")
    print("| planner | requests | mean ratio | worst ratio | padded requests |")
    print("|---|---|---|---|---|")
    for solver, values in ratios.items():
        padded = sum(1 for v in values if v > 1 + 1e-12)
        print(f"| {solver} | {len(values)} | {statistics.fmean(values):.4f} | {max(values):.4f} | {padded} |")


if __name__ == "__main__":
    main()

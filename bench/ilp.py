"""The exact model against the heuristic: gap reached at 1 s and 10 s per backend, by problem size.

For 16..256 sequences in DP2 x CP4 and DP4 x CP8 (Qwen2.5-0.5B profile, real-shaped lengths), one
global batch each: objective and gap of ``ilp`` with CP-SAT and SCIP at each budget, skrull's gap to
the best bound found, and ``auto``'s gain over skrull. Prints Markdown; asserts nothing.
Run: python bench/ilp.py [--datasets a,b] [--budgets 1,10] [--sizes 16,32,64,128,256]
"""

from __future__ import annotations

import argparse
import dataclasses
import platform

from skrull.solver.lengths.datasets import synthesize_request
from skrull.solver.planning import solve
from skrull.solver.profile import load_profile
from skrull.solver.types import Parallel

LAYOUTS = [Parallel(dp=2, cp=4), Parallel(dp=4, cp=8)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--datasets", default="sharegpt,mooncake")
    parser.add_argument("--budgets", default="1,10")
    parser.add_argument("--sizes", default="16,32,64,128,256")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    budgets = [float(b) for b in args.budgets.split(",")]
    profile = load_profile("h100-80g/qwen2.5-0.5b")
    print(f"machine: {platform.machine()} python {platform.python_version()}; profile {profile.name}\n")
    cols = [f"{b}({s:g}s)" for s in budgets for b in ("cpsat", "scip")]
    print(
        "| dataset | layout | sequences | skrull ms | "
        + " | ".join(f"ilp {c}: ms / gap / status" for c in cols)
        + " | skrull gap to best bound | "
        + " | ".join(f"auto({s:g}s) ms / gain" for s in budgets)
        + " |"
    )
    print("|" + "---|" * (4 + len(cols) + 1 + len(budgets)))
    for dataset in args.datasets.split(","):
        for parallel in LAYOUTS:
            for n in (int(x) for x in args.sizes.split(",")):
                if n % parallel.dp:
                    continue
                request = synthesize_request(
                    dataset=dataset,
                    parallel=parallel,
                    profile=profile,
                    sequences_per_rank=n // parallel.dp,
                    seed=args.seed,
                )
                skrull = solve(request)
                cells = []
                # skrull's plan is static: its gap is to the best bound over static plans (the static
                # bound, the exact model's over the static layout, auto's over every layout)
                best_bound = sum(it.static_bound_ms or it.lower_bound_ms for it in skrull.iterations)
                for budget in budgets:
                    for backend in ("cpsat", "scip"):
                        plan = solve(dataclasses.replace(request, solver="ilp", backend=backend, time_budget_s=budget))
                        best_bound = max(best_bound, plan.solve.model_bound_ms or plan.solve.bound_ms or 0.0)
                        cells.append(
                            f"{plan.estimated_ms:.1f} / {100 * (plan.solve.model_gap or 0):.2f}% / "
                            f"{plan.solve.status} ({plan.solve.wall_ms / 1e3:.1f}s)"
                        )
                autos = []
                for budget in budgets:
                    plan = solve(dataclasses.replace(request, solver="auto", time_budget_s=budget))
                    best_bound = max(best_bound, plan.solve.bound_ms or 0.0)
                    autos.append(f"{plan.estimated_ms:.1f} / {skrull.estimated_ms / plan.estimated_ms:.2f}x")
                skrull_gap = (skrull.estimated_ms - best_bound) / skrull.estimated_ms
                print(
                    f"| {dataset} | DP{parallel.dp} x CP{parallel.cp} | {n} | {skrull.estimated_ms:.1f} | "
                    + " | ".join(cells)
                    + f" | {100 * skrull_gap:.1f}% | "
                    + " | ".join(autos)
                    + " |",
                    flush=True,
                )


if __name__ == "__main__":
    main()

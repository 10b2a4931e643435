"""Quality against budget: every planner and the bound, per 256-sequence batch, at budgets 0.05-10 s.

Two model shapes (Skrull section 5.1 hardware): Qwen2.5-0.5B on DP4 x CP8 and Qwen2.5-7B on DP2 x CP16,
one 256-sequence global batch per request sampled (fixed seed) from every bundled distribution. A cell
is the plan's time per unit of work over the specification's layout-free lower bound (``solver.metrics.
work_ms``: 1.000 is the bound; a planner that defers sequences is charged per unit of work it runs), and
the solve wall time in ms (``planning.solve``, budget check, planning, estimating and validating).
``refused`` is an early ``time_budget_s`` refusal (the planner cannot keep that budget); a wall time
over ``budget + max(20 ms, 5%)`` is marked ``!``. The ``tight bound`` column is ``search.bound.
microbatch_floor_ms`` over the reference lower bound: how far above the reference lower bound every plan must be.

Run: ``python bench/budget.py [--quick] [--budgets 0.05,0.1] [--ten-second-datasets a,b] [--large]``. Prints
Markdown (with commit, machine, date and load average); asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import statistics
import subprocess
import time

from skrull.solver.cost import CostModel
from skrull.solver.errors import RequestError
from skrull.solver.lengths.datasets import distribution_names, synthesize_request
from skrull.solver.metrics import work_ms
from skrull.solver.planners.minmax_ilp import preload_cp_sat
from skrull.solver.planners.registry import planner_names
from skrull.solver.planning import solve
from skrull.solver.profile import load_profile
from skrull.solver.search.bound import layout_free_bound_ms, microbatch_floor_ms
from skrull.solver.types import Parallel, Plan, Request

SETUPS = [
    ("h100-80g/qwen2.5-0.5b", Parallel(dp=4, cp=8)),
    ("h100-80g/qwen2.5-7b", Parallel(dp=2, cp=16)),
]
BATCH_SEQUENCES = 256
BUDGETS = (0.05, 0.1, 0.3, 1.0, 10.0)
QUICK_DATASETS = ("arxiv", "github", "mooncake")


def allowed_ms(budget_s: float) -> float:
    """The promise: ``budget + max(20 ms, 5%)``."""
    return 1e3 * budget_s + max(20.0, 50.0 * budget_s)


def ratio_to_bound(request: Request, solver: str) -> tuple[float | None, float]:
    """(time per unit of work over the layout-free bound, or None if refused; wall ms)."""
    begin = time.perf_counter()
    try:
        plan = solve(dataclasses.replace(request, solver=solver))
    except RequestError:
        return None, 1e3 * (time.perf_counter() - begin)
    wall = 1e3 * (time.perf_counter() - begin)
    lengths = [s for batch in request.batches for s in batch]
    model = CostModel(request.profile, bucket_tokens=request.bucket_tokens)
    full_work = full_work_ms(lengths, model, request.parallel)
    per_work = plan.estimated_ms / work_ms(plan, lengths, model)
    return per_work * full_work / layout_free_bound_ms(lengths, model, request.parallel), wall


def full_work_ms(lengths: list[int], model: CostModel, parallel: Parallel) -> float:
    """The whole request's work per GPU (``CostCoefficients.work_ms`` summed, over the GPUs)."""
    return sum(model.coefficients.work_ms(s) for s in lengths) / parallel.num_gpus


def plan_over_floor(plan: Plan, request: Request) -> float:
    """Time per unit of work, charged at the whole request's work, over ``microbatch_floor_ms``: a plan that
    defers sequences is charged per unit of the work it runs (what never_behind.py and auto_scale.py report)."""
    lengths = [s for batch in request.batches for s in batch]
    model = CostModel(request.profile, bucket_tokens=request.bucket_tokens)
    per_work = plan.estimated_ms / work_ms(plan, lengths, model) * full_work_ms(lengths, model, request.parallel)
    return per_work / microbatch_floor_ms(lengths, model, request.parallel)


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help=f"budgets 0.05-0.3 s on {', '.join(QUICK_DATASETS)}")
    parser.add_argument("--budgets", default=None, help="comma-separated seconds per batch")
    parser.add_argument("--datasets", default=None, help="comma-separated (default: all bundled)")
    parser.add_argument("--ten-second-datasets", default=None, help="datasets run at budgets >= 10 s")
    parser.add_argument("--solvers", default=None, help="comma-separated (default: every planner)")
    parser.add_argument("--setups", default="0,1", help="indices into SETUPS")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--large", action="store_true", help="also auto on 65,536 sequences with a 2 s budget")
    args = parser.parse_args()
    preload_cp_sat()  # as a service's solver process does; bench/cold_wall.py measures cold processes
    budgets = [float(b) for b in args.budgets.split(",")] if args.budgets else list(BUDGETS)
    datasets = args.datasets.split(",") if args.datasets else list(distribution_names())
    if args.quick:
        budgets = [b for b in budgets if b <= 0.3] if not args.budgets else budgets
        datasets = [d for d in datasets if d in QUICK_DATASETS]
    ten = args.ten_second_datasets.split(",") if args.ten_second_datasets else datasets
    solvers = args.solvers.split(",") if args.solvers else list(planner_names())
    print(
        f"commit {git_commit()}, {platform.node()} {platform.machine()} ({os.cpu_count()} cores), python "
        f"{platform.python_version()}, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
        f"load average at start {os.getloadavg()[0]:.2f}"
    )
    for index in (int(i) for i in args.setups.split(",")):
        profile_name, parallel = SETUPS[index]
        profile = load_profile(profile_name)
        per_rank = BATCH_SEQUENCES // parallel.dp
        requests = {
            d: synthesize_request(
                dataset=d,
                parallel=parallel,
                profile=profile,
                sequences_per_rank=per_rank,
                num_batches=1,
                seed=args.seed,
            )
            for d in datasets
        }
        for budget in budgets:
            names = [d for d in datasets if budget < 10 or d in ten]
            print(
                f"\n### {profile_name}, DP{parallel.dp} x CP{parallel.cp}, {BATCH_SEQUENCES} sequences, "
                f"budget {budget:g} s (allowed wall {allowed_ms(budget):.0f} ms), load {os.getloadavg()[0]:.2f}\n"
            )
            print("| dataset | tight bound | " + " | ".join(solvers) + " |")
            print("|---|---|" + "---|" * len(solvers))
            auto_ratios = []
            auto_tight = []
            worst_wall = 0.0
            behind: list[str] = []
            for d in names:
                request = dataclasses.replace(requests[d], time_budget_s=budget)
                tight = tight_over_contract(request)
                cells = [f"{tight:.3f}"]
                results = {s: ratio_to_bound(request, s) for s in solvers}
                for s in solvers:
                    ratio, wall = results[s]
                    if ratio is None:
                        cells.append(f"refused ({wall:.0f})")
                        continue
                    worst_wall = max(worst_wall, wall / allowed_ms(budget))
                    mark = "!" if wall > allowed_ms(budget) else ""
                    cells.append(f"{ratio:.3f} ({wall:.0f}{mark})")
                if "auto" in results and results["auto"][0] is not None:
                    auto = results["auto"][0]
                    auto_ratios.append(auto)
                    auto_tight.append(auto / tight)
                    behind += [
                        f"{d}: {s} {r:.3f} < {auto:.3f}"
                        for s, (r, _) in results.items()
                        if s != "auto" and r is not None and r < auto - 1e-9
                    ]
                print(f"| {d} | " + " | ".join(cells) + " |", flush=True)
            if auto_ratios:
                print(
                    f"\nauto: mean {statistics.mean(auto_ratios):.4f}x the reference lower bound, "
                    f"{statistics.mean(auto_tight):.4f}x the tight bound; behind another planner: "
                    f"{'; '.join(behind) or 'never'}; slowest wall (any planner) "
                    f"{100 * worst_wall:.0f}% of the allowed",
                    flush=True,
                )
    if args.large:
        large()


def tight_over_contract(request: Request) -> float:
    """``search.bound.microbatch_floor_ms`` over the reference layout-free lower bound (>= 1)."""
    lengths = [s for batch in request.batches for s in batch]
    model = CostModel(request.profile, bucket_tokens=request.bucket_tokens)
    contract = layout_free_bound_ms(lengths, model, request.parallel)
    return microbatch_floor_ms(lengths, model, request.parallel) / contract


def large() -> None:
    """``auto`` on 65,536 sequences (256 batches of 256, DP4 x CP8) with a 2 s budget."""
    profile_name, parallel = SETUPS[0]
    request = synthesize_request(
        dataset="sharegpt",
        parallel=parallel,
        profile=load_profile(profile_name),
        sequences_per_rank=BATCH_SEQUENCES // parallel.dp,
        num_batches=256,
        seed=0,
    )
    request = dataclasses.replace(request, solver="auto", time_budget_s=2.0)
    begin = time.perf_counter()
    plan = solve(request)
    wall = time.perf_counter() - begin
    bound = plan.solve.bound_ms or 0.0
    print(
        f"\n65,536 sequences (256 x 256, sharegpt, DP4 x CP8), auto, budget 2 s: wall {1e3 * wall:.0f} ms "
        f"(allowed {allowed_ms(2.0):.0f}), {plan.estimated_ms / bound:.3f}x its tight bound, valid plan, "
        f"load {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()

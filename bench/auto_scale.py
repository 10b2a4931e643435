"""How ``auto``'s quality, time and memory grow from 256 to 65,536 sequences, against ``hydraulis`` with all
the time it needs.

One global batch per request on DP64 x CP8 (512 GPUs, Qwen2.5-0.5B profile), drawn from a bundled
distribution (seed fixed per size, so the table is reproducible; ``--seed`` changes it). ``auto`` gets a
budget that grows with the batch (0.1 s for 256 sequences up to 5 s for 65,536); ``hydraulis`` gets its
default budget (``search.budget.default_budget_s``: what it needs for its stage-2 ILPs at that size, 73 s
for 65,536 sequences). A cell is time per unit of work over the floor (``search.bound.microbatch_floor_ms``,
valid for every layout), the solve's wall time, and its peak memory: each solve runs in a fresh process
and reports its peak resident set (its own and its children's, the forked starts) less the process's
resident set after the imports.

    python bench/auto_scale.py [--datasets sharegpt,mooncake] [--sizes 256,...,65536] [--seed 5]

Prints Markdown (machine, date, commit, load average); asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

from budget import git_commit  # bench/budget.py

ROOT = Path(__file__).resolve().parents[1]
PARALLEL = (64, 8)
PROFILE = "h100-80g/qwen2.5-0.5b"
#: auto's budget by batch size (seconds)
AUTO_BUDGET_S = {256: 0.1, 1024: 0.3, 4096: 1.0, 16384: 2.0, 65536: 5.0}


def one(solver: str, dataset: str, size: int, seed: int, budget_s: float | None) -> dict[str, float]:
    """Runs in its own process: the solve's ratio to the floor, wall and peak memory (MiB)."""
    import dataclasses

    from budget import plan_over_floor  # bench/budget.py: the same figure as never_behind.py

    from skrull.solver.lengths.datasets import synthesize_request
    from skrull.solver.planners.minmax_ilp import preload_cp_sat
    from skrull.solver.planning import solve
    from skrull.solver.profile import load_profile
    from skrull.solver.types import Parallel

    preload_cp_sat()  # as a service's solver process does
    parallel = Parallel(dp=PARALLEL[0], cp=PARALLEL[1])
    request = synthesize_request(
        dataset=dataset, parallel=parallel, profile=load_profile(PROFILE), sequences_per_rank=size // parallel.dp,
        seed=seed,
    )  # fmt: skip
    request = dataclasses.replace(request, solver=solver, time_budget_s=budget_s)
    base_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    begin = time.perf_counter()
    plan = solve(request)
    wall_s = time.perf_counter() - begin
    peak_kib = max(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    )
    return {
        "ratio": plan_over_floor(plan, request),
        "wall_s": wall_s,
        "budget_s": request.resolved_time_budget_s,
        "memory_mib": max(0, peak_kib - base_kib) / 1024,
    }


def run(solver: str, dataset: str, size: int, seed: int, budget_s: float | None) -> dict[str, float]:
    args = [sys.executable, __file__, "--one", json.dumps([solver, dataset, size, seed, budget_s])]
    out = subprocess.run(args, capture_output=True, text=True, check=True, cwd=ROOT)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--datasets", default="sharegpt,mooncake")
    parser.add_argument("--sizes", default=",".join(str(s) for s in AUTO_BUDGET_S))
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one(*json.loads(args.one))))
        return
    print(
        f"commit {git_commit()}, {platform.machine()} ({os.cpu_count()} cores), python {platform.python_version()}, "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, load average at start {os.getloadavg()[0]:.2f}; "
        f"DP{PARALLEL[0]} x CP{PARALLEL[1]}, {PROFILE}, seed {args.seed}\n"
    )
    print(
        "| dataset | sequences | auto budget | auto / floor | auto wall | auto memory | hydraulis budget | "
        "hydraulis / floor | hydraulis wall | hydraulis memory | auto over hydraulis |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for dataset in args.datasets.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            a = run("auto", dataset, size, args.seed, AUTO_BUDGET_S.get(size, 5.0))
            h = run("hydraulis", dataset, size, args.seed, None)
            print(
                f"| {dataset} | {size:,} | {a['budget_s']:g} s | {a['ratio']:.4f} | {a['wall_s']:.2f} s | "
                f"{a['memory_mib']:.0f} MiB | {h['budget_s']:.3g} s | {h['ratio']:.4f} | {h['wall_s']:.2f} s | "
                f"{h['memory_mib']:.0f} MiB | {a['ratio'] / h['ratio'] - 1:+.2%} |",
                flush=True,
            )


if __name__ == "__main__":
    main()

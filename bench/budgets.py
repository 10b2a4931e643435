"""Budgets kept in wall time: each planner's solve against its promise, ``budget + max(20 ms, 5%)``.

The tests bound the CPU a planner burns (tests/conftest.py ``cpu_seconds``), which a loaded machine cannot
make fail; the wall-time promise depends on the machine's load, so it is measured here, with the load
average beside every row:

* every budgeted planner and a few heuristics on a modest request (2 batches of 256 sequences, DP4 x CP8,
  Qwen2.5-0.5B), 0.5 s;
* ``ilp`` and ``auto`` on two batches of 96 sequences at DP4 x CP4, 1.5 s for the whole request;
* ``auto`` on 65,536 sequences (256 batches of 256, and one batch of 65,536), 2 s.

    python bench/budgets.py [--repeat 3]

Prints Markdown (machine, date, commit, load); asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import random
import time

from budget import git_commit  # bench/budget.py (the script's folder is on sys.path)

from skrull.solver.io import request_from_dict
from skrull.solver.lengths.datasets import synthesize_request
from skrull.solver.planning import solve
from skrull.solver.profile import load_profile
from skrull.solver.types import Parallel, Request


def qwen_request(num_batches: int, per_rank: int, *, dataset: str = "mooncake") -> Request:
    return synthesize_request(
        dataset=dataset,
        parallel=Parallel(dp=4, cp=8),
        profile=load_profile("h100-80g/qwen2.5-0.5b"),
        sequences_per_rank=per_rank,
        num_batches=num_batches,
        seed=1,
    )


def small_request(solver: str) -> Request:
    rng = random.Random(7)
    batches = [[rng.randint(1, 400) for _ in range(96)] for _ in range(2)]
    return request_from_dict(
        {
            "batches": batches,
            "parallel": {"dp": 4, "cp": 4},
            "profile": {
                "name": "hand",
                "compute": {"flops_per_token": 1e9, "flops_per_token_sq": 1e5, "ms_per_tflop": 2.0, "fixed_ms": 0.5},
                "comm": {"bytes_per_token": 2**20, "ms_per_mib": 0.001, "fixed_ms": 0.2},
                "memory": {"bucket_tokens": 100},
                "microbatch_ms": 3.0,
            },
            "solver": solver,
            "time_budget_s": 1.5,
        }
    )


def cases() -> list[tuple[str, Request]]:
    out = []
    for solver in ("auto", "ilp", "ilp-flex", "skrull", "hydraulis", "wlb", "dynamic-cp"):
        out.append(
            (f"{solver}, 2 x 256 sequences", dataclasses.replace(qwen_request(2, 32), solver=solver, time_budget_s=0.5))
        )
    for solver in ("ilp", "auto"):
        out.append((f"{solver}, 2 x 96 sequences, DP4 x CP4", small_request(solver)))
    for num_batches, per_rank in ((256, 64), (1, 16384)):
        request = dataclasses.replace(
            qwen_request(num_batches, per_rank, dataset="sharegpt"), solver="auto", time_budget_s=2.0
        )
        out.append((f"auto, {num_batches} x {65536 // num_batches} sequences", request))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(
        f"*{platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, "
        f"{datetime.date.today()}, commit {git_commit()}*\n"
    )
    print("| case | budget s | promise s | wall s (worst of runs) | within | load |")
    print("|---|---|---|---|---|---|")
    for label, request in cases():
        budget = request.time_budget_s or 0.0
        promise = budget + max(0.02, 0.05 * budget)
        walls = []
        for _ in range(args.repeat):
            begin = time.perf_counter()
            solve(request)
            walls.append(time.perf_counter() - begin)
        worst = max(walls)
        print(
            f"| {label} | {budget:g} | {promise:.3f} | {worst:.3f} | {'yes' if worst <= promise else 'NO'} "
            f"| {os.getloadavg()[0]:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()

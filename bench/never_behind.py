"""Is ``auto`` at 0.1 s per batch ever behind another planner run with its default budget? On fresh draws.

Each run draws new requests (a seed from the clock unless ``--seed``): for both bench shapes (Qwen2.5-0.5B
on DP4 x CP8, Qwen2.5-7B on DP2 x CP16, Skrull section 5.1) and 256-sequence global batches, ``--draws``
requests from every bundled distribution plus as many two-distribution mixes (a random share of a
long-tailed distribution's lengths among a short one's: the bimodal batches long-context SFT mixes
make). On each request ``auto`` runs with ``time_budget_s=0.1`` and every other planner with its own
default budget (``time_budget_s`` left out: ``search.budget.default_budget_s``, 1 s for most). The exact
planners (``ilp``, ``ilp-flex``) are left out here: they start from ``auto`` and search for up to 60 s,
so they measure ``auto`` against itself with 600 times the time (docs/benchmarks-auto.md, "The true gap").

A cell is time per unit of work (``solver.metrics.work_ms``: a planner that defers sequences is charged
per unit of the work it runs) over the floor (``search.bound.microbatch_floor_ms``, valid for every
layout). ``auto`` is *behind* a planner when its ratio exceeds that planner's by more than 1e-9.

    python bench/never_behind.py [--draws 1] [--seed N] [--budget 0.1]

Prints Markdown (seed, machine, date, commit, load average); asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import random
import statistics
import sys
import time

from budget import git_commit, plan_over_floor  # bench/budget.py: the same figures
from tqdm import tqdm

from skrull.solver.datasets import distribution_names, synthesize_request
from skrull.solver.planners.minmax_ilp import preload_cp_sat
from skrull.solver.planners.registry import planner_names
from skrull.solver.planning import solve
from skrull.solver.profile import load_profile
from skrull.solver.types import Parallel, Request

SETUPS = (
    ("h100-80g/qwen2.5-0.5b", Parallel(dp=4, cp=8)),
    ("h100-80g/qwen2.5-7b", Parallel(dp=2, cp=16)),
)
BATCH_SEQUENCES = 256
EXACT = ("ilp", "ilp-flex")
#: short-sequence and long-tailed distributions a mix draws from
SHORT = ("sharegpt", "azure-conv", "azure-code", "llama3-sft-mix")
LONG = ("chatqa2-long-sft", "arxiv", "github", "mooncake", "commoncrawl")


def mixed_request(profile_name: str, parallel: Parallel, rng: random.Random) -> tuple[str, Request]:
    """A batch of one short and one long-tailed distribution's lengths, a random share (5-40%) long."""
    short, long = rng.choice(SHORT), rng.choice(LONG)
    share = rng.uniform(0.05, 0.40)
    per_rank = BATCH_SEQUENCES // parallel.dp
    profile = load_profile(profile_name)
    a, b = (
        synthesize_request(dataset=d, parallel=parallel, profile=profile, sequences_per_rank=per_rank,
                           seed=rng.randrange(2**31))
        for d in (short, long)
    )  # fmt: skip
    num_long = round(share * BATCH_SEQUENCES)
    lengths = list(a.batches[0][: BATCH_SEQUENCES - num_long]) + list(b.batches[0][:num_long])
    rng.shuffle(lengths)
    return f"{short}+{num_long} {long}", dataclasses.replace(a, batches=(tuple(lengths),))


def ratio_to_floor(request: Request, solver: str, budget_s: float | None) -> float:
    return plan_over_floor(solve(dataclasses.replace(request, solver=solver, time_budget_s=budget_s)), request)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--draws", type=int, default=1, help="requests per distribution (and mixes) and shape")
    parser.add_argument("--seed", type=int, default=None, help="default: from the clock (fresh requests)")
    parser.add_argument("--budget", type=float, default=0.1, help="auto's time_budget_s")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    rng = random.Random(seed)
    preload_cp_sat()  # as a service's solver process does
    others = [n for n in planner_names() if n not in ("auto", *EXACT)]
    print(
        f"seed {seed}; commit {git_commit()}, {platform.machine()} ({os.cpu_count()} cores), python "
        f"{platform.python_version()}, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
        f"load average at start {os.getloadavg()[0]:.2f}; auto at {args.budget:g} s, the others at their default"
    )
    for profile_name, parallel in SETUPS:
        profile = load_profile(profile_name)
        jobs: list[tuple[str, Request]] = []
        for _ in range(args.draws):
            for d in distribution_names():
                request = synthesize_request(
                    dataset=d, parallel=parallel, profile=profile, sequences_per_rank=BATCH_SEQUENCES // parallel.dp,
                    seed=rng.randrange(2**31),
                )  # fmt: skip
                jobs.append((d, request))
            for _ in range(len(SHORT)):
                jobs.append(mixed_request(profile_name, parallel, rng))
        rows = []
        for name, request in tqdm(jobs, file=sys.stderr, leave=False, disable=None, desc=profile_name):
            auto = ratio_to_floor(request, "auto", args.budget)
            theirs = {s: ratio_to_floor(request, s, None) for s in others}
            best = min(theirs, key=lambda s: theirs[s])
            rows.append((name, auto, best, theirs[best]))
        behind = [r for r in rows if r[1] > r[3] + 1e-9]
        autos = [r[1] for r in rows]
        print(f"\n### {profile_name}, DP{parallel.dp} x CP{parallel.cp}, {len(rows)} requests of {BATCH_SEQUENCES}\n")
        print(
            f"auto / floor: mean {statistics.fmean(autos):.4f}, worst {max(autos):.4f}; "
            f"behind another planner on {len(behind)} of {len(rows)}\n"
        )
        print("| request | auto / floor | best other | its ratio | auto over it |")
        print("|---|---|---|---|---|")
        for name, a, best, b in rows:
            print(f"| {name} | {a:.4f} | {best} | {b:.4f} | {a / b - 1:+.2%} |")


if __name__ == "__main__":
    main()

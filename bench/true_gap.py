"""The true gap: ``auto`` at 0.1 s and 10 s against the exact flexible model on small requests.

Requests of 8-64 sequences, one global batch each: the bench shapes (DP2 x CP4 and other small layouts,
Qwen2.5-0.5B and Qwen2.5-7B, lengths sampled with a fixed seed from the bundled distributions) and, each
run, random draws at the bucket's edges (lengths just under and just over ``bucket_tokens`` and just over
``k * bucket_tokens``, with short ones between; the seed is printed). For each request:

* ``floor``: ``search.bound.microbatch_floor_ms``, the bound ``auto`` reports (valid for every layout);
* ``bound``: ``search.bound.sharding_floor_ms`` (valid for every layout, >= the floor);
* ``ilp-flex``: the exact flexible model solved as far as ``--exact-s`` goes: its plan, its bound (the
  larger of ``bound`` and the solver's dual bound; the dual bound holds over the model's groups: single
  GPUs, runs of whole CP groups and the warm start's groups) and status (``optimal``: proven over those
  groups);
* ``auto`` at 0.1 s and 10 s: ms, over ``bound`` and over the best ``ilp-flex`` plan (its optimum where
  proven; below 1.000 where ``auto`` found a plan the model's groups cannot express or the model did not
  reach).

Run: ``python bench/true_gap.py [--quick] [--exact-s 60] [--seed N] [--plans]``. Prints Markdown (commit,
machine, date, load average); asserts nothing. ``--quick``: four requests, the exact model 20 s each
(70 s on the 2-core VM). ``--plans`` prints the microbatches of the ``auto`` (10 s) and ``ilp-flex`` plans.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import random
import time
from dataclasses import dataclass

from budget import git_commit  # bench/budget.py

from skrull.solver.cost import CostModel
from skrull.solver.lengths.datasets import synthesize_request
from skrull.solver.planning import solve
from skrull.solver.profile import Profile, load_profile
from skrull.solver.search.bound import microbatch_floor_ms, sharding_floor_ms
from skrull.solver.types import Parallel, Plan, Request

SMALL = "h100-80g/qwen2.5-0.5b"
LARGE = "h100-80g/qwen2.5-7b"


@dataclass(frozen=True, slots=True)
class Shape:
    """A sampled request: profile, layout, distribution, sequences in the batch."""

    profile: str
    parallel: Parallel
    dataset: str
    sequences: int


#: The bench shapes (seed 1), full run.
SHAPES = (
    Shape(SMALL, Parallel(dp=2, cp=4), "sharegpt", 24),
    Shape(SMALL, Parallel(dp=2, cp=4), "github", 24),
    Shape(SMALL, Parallel(dp=2, cp=4), "azure-code", 24),
    Shape(SMALL, Parallel(dp=2, cp=4), "sharegpt", 64),
    Shape(SMALL, Parallel(dp=4, cp=2), "github", 16),
    Shape(LARGE, Parallel(dp=2, cp=4), "sharegpt", 24),
    Shape(LARGE, Parallel(dp=2, cp=4), "github", 24),
    Shape(LARGE, Parallel(dp=2, cp=4), "arxiv", 16),
    Shape(LARGE, Parallel(dp=2, cp=2), "sharegpt", 16),
)
#: Edge draws per run, full run: (profile, layout, sequences).
EDGES = (
    (SMALL, Parallel(dp=2, cp=4), 12),
    (LARGE, Parallel(dp=2, cp=4), 12),
    (SMALL, Parallel(dp=2, cp=2), 8),
    (LARGE, Parallel(dp=4, cp=2), 16),
)
QUICK_SHAPES = (SHAPES[0], SHAPES[5])
QUICK_EDGES = (EDGES[0], EDGES[2])
#: How far past ``bucket_tokens`` (or ``k * bucket_tokens``) an edge length lies, at most.
EDGE_TOKENS = 64


def edge_lengths(rng: random.Random, count: int, bucket_tokens: int, cp: int) -> list[int]:
    """``count`` lengths at the bucket's edges: a quarter short (64 .. bucket/4), the rest just under
    ``bucket_tokens``, just over it, or just over ``k * bucket_tokens`` (2 <= k < cp), capped at
    ``cp * bucket_tokens`` (the most any plan can hold)."""
    out = []
    for _ in range(count):
        delta = rng.randint(1, EDGE_TOKENS)
        kind = rng.choice(("short", "under", "over", "multiple"))
        if kind == "short":
            out.append(rng.randint(64, bucket_tokens // 4))
        elif kind == "under":
            out.append(bucket_tokens - delta)
        elif kind == "over" or cp < 3:
            out.append(min(bucket_tokens + delta, cp * bucket_tokens))
        else:
            out.append(min(rng.randint(2, cp - 1) * bucket_tokens + delta, cp * bucket_tokens))
    return out


def requests(quick: bool, seed: int) -> list[tuple[str, Request]]:
    """(label, request) of every shape and edge draw of this run."""
    out = []
    for shape in QUICK_SHAPES if quick else SHAPES:
        profile = load_profile(shape.profile)
        request = synthesize_request(
            dataset=shape.dataset,
            parallel=shape.parallel,
            profile=profile,
            sequences_per_rank=shape.sequences // shape.parallel.dp,
            seed=1,
        )
        out.append((shape.dataset, request))
    rng = random.Random(seed)
    for profile_name, parallel, count in QUICK_EDGES if quick else EDGES:
        profile = load_profile(profile_name)
        lengths = edge_lengths(rng, count, profile.bucket_tokens, parallel.cp)
        out.append(("edges", Request(batches=(tuple(lengths),), parallel=parallel, profile=profile, solver="auto")))
    return out


def plan_lines(plan: Plan, lengths: tuple[int, ...]) -> list[str]:
    """One line per microbatch: step, ranks, local lengths per rank, sharded lengths, ms."""
    out = []
    for mb in sorted(plan.iterations[0].microbatches, key=lambda m: (m.step, m.ranks)):
        local = [[lengths[i] for i in ids] for ids in mb.local]
        out.append(
            f"    step {mb.step} ranks {list(mb.ranks)} local {local} sharded "
            f"{[lengths[i] for i in mb.sharded]} {mb.estimated_ms:.2f} ms"
        )
    return out


def short_name(profile: Profile) -> str:
    return profile.name.split("/")[-1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--exact-s", type=float, default=None, help="ilp-flex s per request (60; quick 20)")
    parser.add_argument("--seed", type=int, default=None, help="edge draws' seed (default: from the clock)")
    parser.add_argument("--plans", action="store_true")
    args = parser.parse_args()
    exact_s = args.exact_s if args.exact_s is not None else (20.0 if args.quick else 60.0)
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    print(
        f"commit {git_commit()}, {platform.machine()} ({os.cpu_count()} cores), python "
        f"{platform.python_version()}, {datetime.date.today().isoformat()}, load average at start "
        f"{os.getloadavg()[0]:.2f}; ilp-flex (CP-SAT) {exact_s:g} s per request; edge seed {seed}\n"
    )
    print(
        "| profile | layout | lengths | K | floor ms | bound ms | ilp-flex ms / bound ms / status | "
        "auto 0.1 s ms (/bound, /ilp-flex) | auto 10 s ms (/bound, /ilp-flex) | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    notes = []
    for label, request in requests(args.quick, seed):
        lengths = request.batches[0]
        cost = CostModel(request.profile, bucket_tokens=request.bucket_tokens)
        floor = microbatch_floor_ms(lengths, cost, request.parallel)
        bound = sharding_floor_ms(lengths, cost, request.parallel)
        autos = [solve(dataclasses.replace(request, solver="auto", time_budget_s=b)) for b in (0.1, 10.0)]
        exact = solve(dataclasses.replace(request, solver="ilp-flex", time_budget_s=exact_s))
        best_ms = min(exact.estimated_ms, *(a.estimated_ms for a in autos))
        exact_bound = exact.solve.model_bound_ms or exact.solve.bound_ms or 0.0  # over ilp-flex's groups
        cells = [
            f"{a.estimated_ms:.2f} ({a.estimated_ms / bound:.4f}, {a.estimated_ms / exact.estimated_ms:.4f})"
            for a in autos
        ]
        par = request.parallel
        print(
            f"| {short_name(request.profile)} | DP{par.dp} x CP{par.cp} | {label} | {len(lengths)} | {floor:.2f} | "
            f"{bound:.2f} | {exact.estimated_ms:.2f} / {exact_bound:.2f} / {exact.solve.status} | "
            + " | ".join(cells)
            + f" | {os.getloadavg()[0]:.2f} |",
            flush=True,
        )
        if args.plans:
            notes.append(
                f"{short_name(request.profile)} DP{par.dp} x CP{par.cp} {label} {len(lengths)}: lengths "
                f"{sorted(lengths, reverse=True)}, best {best_ms:.2f} ms"
            )
            notes += ["  auto 10 s:", *plan_lines(autos[1], lengths), "  ilp-flex:", *plan_lines(exact, lengths)]
    if notes:
        print("\n" + "\n".join(notes))


if __name__ == "__main__":
    main()

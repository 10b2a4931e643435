"""Is ``auto`` at 0.1 s per batch ever behind a planner given the same or less wall time? On fresh draws.

What users send, drawn anew each run (a seed from the clock unless ``--seed``; printed): for profiles
derived for models and GPUs other than the bundled ones (bench/shapes.py: Llama-2-7B, 13B and 70B at TP 8
on A100, H100, H200 and B200 shapes, plus Llama-2-7B at TP 1 on H100), ``--per-profile`` requests each,
of one of four kinds in turn:

* ``pure``: one bundled distribution's lengths (every bundled distribution in turn over the profiles);
* ``bimodal``: a short distribution's lengths with a random 5-40% of a long-tailed one's;
* ``outliers``: a short distribution's lengths with 1-5% outliers at 25-100% of the most a plan holds
  (``solver.io.placeable_tokens``: ``cp * bucket_tokens`` less the gathered K/V an all-gather group keeps,
  capped at 1M tokens);
* ``held-out``: the issue's shape, DP2 x CP16, 6 global batches of 80, bimodal;

on a DP x CP layout drawn from 32 and 64 GPUs (DP 1-8), with 1-6 global batches of 64-256 sequences.

Profiles are what ``skrull derive-profile`` writes (bench/shapes.py), with ``topology`` (8 GPUs a node: a
CP group of 4 or 8 sits in a node and uses ``intra_node``, CP 16 and 32 span nodes and use ``inter_node``),
``overlap`` and ``memory.kv_bytes_per_token`` (r = kv / activation bytes per token, the "r" column); the
per-request table says which links ``auto``'s sharded microbatches used.

On each request ``auto`` runs with ``time_budget_s = --budget * batches`` and every other planner with its
own default budget (``search.budget.default_budget_s``), each timed (``planning.solve``'s wall: planning,
estimating, validating). The exact planners (``ilp``, ``ilp-flex``) are left out of the comparison: they
start from ``auto`` and search for up to 60 s. A cell is time per unit of work (``solver.metrics.
work_ms``: a planner that defers sequences is charged per unit of the work it runs) over the floor
(``search.bound.microbatch_floor_ms``, valid for every layout). ``auto`` is *behind* when another planner
that used no more wall time than ``auto`` has a ratio lower by more than a relative 1e-9; planners that took
longer are not compared (their best is shown apart). Losses to ``wlb`` are counted apart too: it defers
outliers to a later iteration, which ``auto`` does only when the request asks (``defer``). Where ``auto``
is behind a deferring planner, it runs again with the same freedom and the same budget: ``defer =
{max_sequences: k, max_wait: w}``, k the most sequences that planner moved out of any one batch and w the
most iterations one of them waits (one left pending waits until the next request); the table says whether
``auto`` is still behind then.

``--slow``: on ``--slow-requests`` of the requests (the ones ``auto`` is farthest from the floor on),
``auto`` and ``ilp-flex`` with ``--slow-budget`` seconds (60 by default): how loose the floor is there
(best / floor) and how far ``auto`` at 0.1 s per batch is from the best plan found.

    python bench/never_behind.py [--per-profile 3] [--seed N] [--budget 0.1] [--slow [--slow-requests 3]]

Prints Markdown (seed, machine, date, commit, load average before and after); asserts nothing.
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
from dataclasses import dataclass

from budget import git_commit, plan_over_floor  # bench/budget.py: the same figures
from shapes import derived, tp8_profiles
from tqdm import tqdm

from skrull.solver.errors import RequestError
from skrull.solver.io import placeable_tokens
from skrull.solver.lengths.datasets import distribution_names, load_distribution
from skrull.solver.planners.minmax_ilp import preload_cp_sat
from skrull.solver.planners.registry import planner_names
from skrull.solver.planning import solve
from skrull.solver.profile import Profile
from skrull.solver.types import Defer, Parallel, Plan, Request

EXACT = ("ilp", "ilp-flex")
#: short-sequence and long-tailed distributions a mix draws from
SHORT = ("sharegpt", "azure-conv", "azure-code", "llama3-sft-mix")
LONG = ("chatqa2-long-sft", "arxiv", "github", "mooncake", "commoncrawl")
KINDS = ("pure", "bimodal", "outliers", "held-out")
LAYOUTS = ((2, 16), (4, 8), (1, 32), (8, 4), (2, 32), (4, 16))
BATCH_SIZES = (64, 80, 128, 256)
MAX_SEQUENCES = 512
MAX_TOKENS = 1 << 20
#: relative margin under which two ratios count as equal (float sums in another order)
TIE = 1e-9
#: planners whose plans may move sequences to a later iteration (WLB-LLM's outlier queues): ``auto`` does so
#: only when the request asks (``defer``), so a loss to them is reported apart
DEFERRING = ("wlb",)
#: the profile whose first request has the issue's held-out shape (not bundled: derived for Llama-2-7B)
HELD_OUT_PROFILE = "h100-80g/llama2-7b"


@dataclass(frozen=True, slots=True)
class Drawn:
    profile: str
    kind: str
    label: str
    request: Request


def lengths_of(dataset: str, count: int, limit: int, rng: random.Random) -> list[int]:
    import numpy as np

    values = load_distribution(dataset).sample(count, np.random.default_rng(rng.randrange(2**31)))
    return [int(min(v, limit)) for v in values]


def draw(profile: Profile, kind: str, pure: str, rng: random.Random) -> tuple[str, Request]:
    """One request of ``kind`` (module doc) on ``profile``; ``pure`` is the distribution a pure draw uses."""
    if kind == "held-out":
        dp, cp, num_batches, size = 2, 16, 6, 80
    else:
        dp, cp = rng.choice(LAYOUTS)
        size = rng.choice(BATCH_SIZES)
        num_batches = rng.randint(1, max(1, MAX_SEQUENCES // size))
    layout = Request(batches=((1,),), parallel=Parallel(dp=dp, cp=cp), profile=profile)
    limit = min(placeable_tokens(layout), MAX_TOKENS)  # what an all-gather group holds with its gathered K/V
    batches = []
    short, long = rng.choice(SHORT), rng.choice(LONG)
    share = rng.uniform(0.05, 0.40) if kind in ("bimodal", "held-out") else rng.uniform(0.01, 0.05)
    for _ in range(num_batches):
        if kind == "pure":
            batch = lengths_of(pure, size, limit, rng)
        elif kind == "outliers":
            num = max(1, round(share * size))
            batch = lengths_of(short, size - num, limit, rng)
            batch += [int(rng.uniform(0.25, 1.0) * limit) for _ in range(num)]
        else:
            num = round(share * size)
            batch = lengths_of(short, size - num, limit, rng) + lengths_of(long, num, limit, rng)
        rng.shuffle(batch)
        batches.append(tuple(batch))
    label = {"pure": pure, "bimodal": f"{short}+{share:.0%} {long}", "held-out": f"{short}+{share:.0%} {long}",
             "outliers": f"{short}+{share:.0%} outliers"}[kind]  # fmt: skip
    request = Request(batches=tuple(batches), parallel=Parallel(dp=dp, cp=cp), profile=profile)
    return f"{label}, DP{dp}xCP{cp}, {num_batches}x{size}", request


def timed(request: Request, solver: str, budget_s: float | None) -> tuple[float, float] | None:
    """(time per unit of work over the floor, wall s), or None where the planner refuses the request."""
    out = timed_plan(request, solver, budget_s)
    return None if out is None else out[:2]


def timed_plan(request: Request, solver: str, budget_s: float | None) -> tuple[float, float, Plan] | None:
    began = time.perf_counter()
    try:
        plan = solve(dataclasses.replace(request, solver=solver, time_budget_s=budget_s))
    except RequestError:
        return None
    return plan_over_floor(plan, request), time.perf_counter() - began, plan


def links_of(plan: Plan) -> str:
    """The links the plan's sharded microbatches on more than one GPU used (``intra``, ``inter``, both)."""
    used = {mb.link for it in plan.iterations for mb in it.microbatches if mb.sharded and len(mb.ranks) > 1}
    return "/".join(sorted(str(u).removesuffix("_node") for u in used)) or "none"


def most_deferred(plan: Plan, request: Request) -> int:
    """The most sequences of one global batch that ``plan`` does not run in that batch's iteration."""
    most, offset = 0, 0
    for k, batch in enumerate(request.batches):
        ran = {i for mb in plan.iterations[k].microbatches for i in mb.seq_ids} if k < len(plan.iterations) else set()
        most = max(most, sum(i not in ran for i in range(offset, offset + len(batch))))
        offset += len(batch)
    return most


def longest_wait(plan: Plan, request: Request) -> int:
    """The most iterations a sequence of ``plan`` waits past its own batch's; one left ``pending`` waits at least
    until the next request (``len(batches) - its batch``). ``defer`` lets a sequence wait ``max_wait`` (default 1)."""
    batch_of = [b for b, batch in enumerate(request.batches) for _ in batch]
    waits = [k - batch_of[i] for k, it in enumerate(plan.iterations) for mb in it.microbatches for i in mb.seq_ids]
    waits += [len(request.batches) - batch_of[i] for i in plan.pending]
    return max(waits, default=0)


def with_same_deferral(request: Request, theirs: Plan, budget_s: float) -> tuple[float, float, int, int] | None:
    """``auto`` allowed what the deferring plan did (module doc): (ratio, wall s, k, the longest wait of the
    deferring plan), None if it deferred none: ``defer = {max_sequences: k, max_wait: that wait}``."""
    k = most_deferred(theirs, request)
    if k == 0:
        return None
    wait = max(1, longest_wait(theirs, request))
    out = timed(dataclasses.replace(request, defer=Defer(max_sequences=k, max_wait=wait)), "auto", budget_s)
    assert out is not None
    return out[0], out[1], k, wait


def profiles() -> list[Profile]:
    return [*tp8_profiles(), derived("llama2-7b", "h100-80g", tp=1)]


def header(args: argparse.Namespace, seed: int) -> str:
    return (
        f"seed {seed}; commit {git_commit()}, {platform.machine()} ({os.cpu_count()} cores), python "
        f"{platform.python_version()}, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
        f"load average {os.getloadavg()[0]:.2f}; auto at {args.budget:g} s per batch, the others at their default"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-profile", type=int, default=3, help="requests per profile")
    parser.add_argument("--seed", type=int, default=None, help="default: from the clock (fresh requests)")
    parser.add_argument("--budget", type=float, default=0.1, help="auto's time_budget_s per global batch")
    parser.add_argument("--slow", action="store_true", help="how loose the floor is, against long searches")
    parser.add_argument("--slow-requests", type=int, default=3)
    parser.add_argument("--slow-budget", type=float, default=60.0)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    rng = random.Random(seed)
    preload_cp_sat()  # as a service's solver process does
    others = [n for n in planner_names() if n not in ("auto", *EXACT)]
    print(header(args, seed))
    dists = list(distribution_names())
    rng.shuffle(dists)
    jobs: list[Drawn] = []
    k = 0
    for profile in profiles():
        for j in range(args.per_profile):
            kind = "held-out" if profile.name == HELD_OUT_PROFILE and j == 0 else KINDS[k % 3]
            label, request = draw(profile, kind, dists[k % len(dists)], rng)
            jobs.append(Drawn(profile.name, kind, label, request))
            k += 1
    rows = []
    same: dict[str, tuple[float, float, int, int] | None] = {}  # label -> auto with the deferring planner's freedom
    links: dict[str, str] = {}  # label -> the links auto's sharded microbatches used
    for job in tqdm(jobs, file=sys.stderr, leave=False, disable=None):
        budget = args.budget * len(job.request.batches)
        auto_out = timed_plan(job.request, "auto", budget)
        assert auto_out is not None
        auto = auto_out[:2]
        links[job.label] = links_of(auto_out[2])
        plans = {s: r for s in others if (r := timed_plan(job.request, s, None)) is not None}
        theirs = {s: r[:2] for s, r in plans.items()}
        within = {s: r for s, r in theirs.items() if r[1] <= auto[1]}
        longer = {s: r for s, r in theirs.items() if r[1] > auto[1]}
        best = min(within, key=lambda s: within[s][0])
        slow_best = min(longer, key=lambda s: longer[s][0]) if longer else None
        if best in DEFERRING and auto[0] > within[best][0] * (1 + TIE):
            same[job.label] = with_same_deferral(job.request, plans[best][2], budget)
        rows.append((job, auto, best, within[best], slow_best, longer.get(slow_best) if slow_best else None))
    print(f"\nload average after {os.getloadavg()[0]:.2f}; {len(rows)} requests\n")
    print("| profile | r | requests | auto / floor, mean | worst | behind a planner with <= wall | by, most | of which "
          "behind a deferring planner |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---|---:|---|")
    for name in dict.fromkeys(r[0].profile for r in rows):
        mine = [r for r in rows if r[0].profile == name]
        r_kv = mine[0][0].request.profile.gathered_kv_ratio
        autos = [r[1][0] for r in mine]
        behind = [r for r in mine if r[1][0] > r[3][0] * (1 + TIE)]
        most = max((r[1][0] / r[3][0] - 1 for r in behind), default=0.0)
        deferring = sum(r[2] in DEFERRING for r in behind)
        print(
            f"| {name} | {r_kv:.3f} | {len(mine)} | {statistics.fmean(autos):.4f} | {max(autos):.4f} "
            f"| {len(behind)} of {len(mine)} "
            f"| {f'{most:+.3%}' if behind else ''} | {deferring if behind else ''} |"
        )
    autos = [r[1][0] for r in rows]
    behind = [r for r in rows if r[1][0] > r[3][0] * (1 + TIE)]
    deferring = sum(r[2] in DEFERRING for r in behind)
    print(
        f"| all | | {len(rows)} | {statistics.fmean(autos):.4f} | {max(autos):.4f} | {len(behind)} of {len(rows)} | "
        f"| {deferring} |"
    )
    for kind in KINDS:
        ratios = [r[1][0] for r in rows if r[0].kind == kind]
        if ratios:
            print(f"| kind: {kind} | | {len(ratios)} | {statistics.fmean(ratios):.4f} | {max(ratios):.4f} | | | |")
    print("\nPer request (`auto over it`: auto's ratio over the best planner's with no more wall, less 1; "
          "`slower best`: the best planner that took longer than auto, not compared):\n")  # fmt: skip
    print("| profile | request | auto's links | auto / floor | auto wall ms | best with <= wall | its ratio "
          "| its wall ms | auto over it | slower best |")  # fmt: skip
    print("|---|---|---|---:|---:|---|---:|---:|---:|---|")
    for job, auto, best, (b_ratio, b_wall), slow_best, slow in rows:
        slow_cell = f"{slow_best} {slow[0]:.4f} ({1e3 * slow[1]:.0f} ms)" if slow_best and slow else ""
        print(
            f"| {job.profile} | {job.label} | {links[job.label]} | {auto[0]:.4f} | {1e3 * auto[1]:.0f} | {best} "
            f"| {b_ratio:.4f} "
            f"| {1e3 * b_wall:.0f} | {auto[0] / b_ratio - 1:+.3%} | {slow_cell} |"
        )
    if same:
        print("\nBehind a deferring planner: `auto` again with the same deferral (`defer.max_sequences` = k, the most "
              "that planner moved out of one batch; `defer.max_wait` = w, the most iterations a sequence of that "
              "planner's plan waits, one left pending past the request waiting until the next one) and the same "
              "budget:\n")  # fmt: skip
        print("| request | deferring planner | its ratio / floor | k | w | auto with defer k, w / floor | its wall ms "
              "| auto over it |")  # fmt: skip
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for job, _auto, best, (b_ratio, _), *_ in rows:
            if job.label in same:
                got = same[job.label]
                if got is None:
                    print(f"| {job.label} | {best} | {b_ratio:.4f} | 0 | 0 | | | |")
                else:
                    print(f"| {job.label} | {best} | {b_ratio:.4f} | {got[2]} | {got[3]} | {got[0]:.4f} "
                          f"| {1e3 * got[1]:.0f} | {got[0] / b_ratio - 1:+.3%} |")  # fmt: skip
    if args.slow:
        slow_rows(rows, args)


def slow_rows(rows: list, args: argparse.Namespace) -> None:  # type: ignore[type-arg]
    """The floor's looseness on the requests ``auto`` is farthest from it on (module doc)."""
    chosen = sorted(rows, key=lambda r: -r[1][0])[: args.slow_requests]
    print(f"\n### How loose the floor is: `auto` and `ilp-flex` with {args.slow_budget:g} s\n")
    print(f"load average {os.getloadavg()[0]:.2f}\n")
    print("| profile | request | auto 0.1 s/batch / floor | best with long budget / floor | by | auto over best |")
    print("|---|---|---:|---:|---|---:|")
    for job, auto, *_ in chosen:
        found = {s: timed(job.request, s, args.slow_budget) for s in ("auto", "ilp-flex")}
        ok = {s: r for s, r in found.items() if r is not None}
        by = min(ok, key=lambda s: ok[s][0])
        best = min(auto[0], ok[by][0])
        print(f"| {job.profile} | {job.label} | {auto[0]:.4f} | {best:.4f} | {by} | {auto[0] / best - 1:+.2%} |")


if __name__ == "__main__":
    main()

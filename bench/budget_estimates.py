"""The up-front budget check against measured walls: for every planner and request shape (sequences, DP x
CP, batches), the raw estimate of ``solver.search.budget`` (the smallest accepted budget is SAFETY = 2 times
it) beside the measured wall of ``planning.solve``, given a generous budget (fixed-work planners) or exactly
the smallest accepted budget (planners that search: ``auto``, ``ilp``, ``ilp-flex``, ``hydraulis``; their
wall must then stay within that budget: they search until their deadline or a proof, so their estimate
is a floor, not a prediction), on a loose bucket and a tight one (``SETUPS``), and ``auto`` with ``defer``
(``auto+defer``, given the budget it needs then). Target: measured <= SAFETY x estimate (the smallest budget
accepted) for every fixed-work planner, and estimate / measured within 0.5..2 where its time follows the
request's shape alone (``skrull``'s GDS is priced for the tight bucket and over-prices a loose one);
measured <= budget + max(20 ms, 5%) for the searching ones. Prints a Markdown table; asserts nothing.
Run: python bench/budget_estimates.py
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import time

from skrull.solver.errors import RequestError
from skrull.solver.lengths.datasets import synthesize_request
from skrull.solver.planners.registry import planner_names
from skrull.solver.planning import solve
from skrull.solver.profile import load_profile
from skrull.solver.search.budget import estimated_s, smallest_budget_s
from skrull.solver.types import Defer, Parallel

SEARCHING = ("auto", "ilp", "ilp-flex", "hydraulis")


#: (sequences, dp, cp, batches): sizes, DP and CP degrees and batch splits the terms depend on; the last two
#: are where GDS and DACP stop being linear (16,384 per DP rank; CP 1,024) and where ``defer`` plans batch by
#: batch (64 batches).
SHAPES = [
    (1024, 4, 8, 1),
    (8192, 4, 8, 1),
    (8192, 64, 8, 1),
    (8192, 4, 8, 8),
    (1024, 4, 64, 1),
    (16384, 2, 8, 1),
    (16384, 1, 8, 1),
    (4096, 1, 1024, 2),
    (16384, 4, 8, 64),
]
#: (profile, lengths): a loose bucket (Qwen2.5-0.5B's, mixed SFT lengths) and a tight one (Qwen2.5-7B's 13,000
#: tokens with ShareGPT's: GDS tries many microbatch counts)
SETUPS = (("h100-80g/qwen2.5-0.5b", "llama3-sft-mix"), ("h100-80g/qwen2.5-7b", "sharegpt"))
#: ``auto`` with ``defer`` (it then plans each batch alone: search.budget's ``deferring``)
DEFERRING = "auto+defer"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--solvers", default=",".join([*planner_names(), DEFERRING]))
    parser.add_argument("--setups", default=",".join(f"{p}:{d}" for p, d in SETUPS), help="profile:dataset,...")
    args = parser.parse_args()
    print(f"machine: {platform.machine()} python {platform.python_version()}\n")
    print(
        "| planner | profile | lengths | sequences | dp x cp | batches | estimate s | budget s | measured s "
        "| estimate / measured |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for setup in args.setups.split(","):
        profile_name, dataset = setup.split(":")
        profile = load_profile(profile_name)
        for name in args.solvers.split(","):
            solver, deferring = name.removesuffix("+defer"), name.endswith("+defer")
            for size, dp, cp, batches in SHAPES:
                base = synthesize_request(
                    dataset=dataset,
                    parallel=Parallel(dp=dp, cp=cp),
                    profile=profile,
                    sequences_per_rank=max(1, size // dp // batches),
                    num_batches=batches,
                    seed=3,
                    solver=solver,
                )
                if deferring:
                    base = dataclasses.replace(base, defer=Defer(max_sequences=4))
                sizes = [len(b) for b in base.batches]
                estimate = estimated_s(solver, sizes, base.parallel)
                searching = solver in SEARCHING
                budget = smallest_budget_s(solver, sizes, base.parallel, deferring=deferring) if searching else 600.0
                request = dataclasses.replace(base, time_budget_s=max(budget, 0.05))
                start = time.perf_counter()
                try:
                    solve(request)
                except RequestError as exc:  # xtuner where Ulysses cannot run: say so, go on
                    print(f"| {name} | {profile_name.split('/')[-1]} | {dataset} | {sum(sizes)} | {dp} x {cp} "
                          f"| {batches} | refused: {exc} |||||", flush=True)  # fmt: skip
                    continue
                measured = time.perf_counter() - start
                print(
                    f"| {name} | {profile_name.split('/')[-1]} | {dataset} | {sum(sizes)} | {dp} x {cp} | {batches} "
                    f"| {estimate:.3f} | {request.time_budget_s:.3f} | {measured:.3f} | {estimate / measured:.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()

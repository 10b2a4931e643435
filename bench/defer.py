"""What deferral gains: ``auto`` with ``"defer": {"max_sequences": k}`` over a stream of batches, carried as
``LoaderOptions(defer_max_sequences=k)`` carries them.

Each run draws fresh streams (a seed from the clock unless ``--seed``) from every bundled distribution: for
each layout below, ``--batches`` consecutive global batches of 256 sequences. Every batch is one request
(the loader's default, one batch per plan); what a plan leaves ``pending`` goes first in the next request
(``defer.carried``), and the last request defers nothing, so every sequence of the stream runs and the cost
of pushing work later is counted. The figure is the stream's estimated time per unit of work,
``sum of iteration estimates / sum of solver.metrics.work_ms`` (reference cost model), for k = 0 (no
deferral), 2, 4 and 8; columns after the first are relative to k = 0 (below 1: deferral saved time).

    python bench/defer.py [--batches 4] [--budget 0.1] [--seed N] [--distributions a,b]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time

import numpy as np
from tqdm import tqdm

from skrull.solver.cost import CostModel
from skrull.solver.lengths.datasets import distribution_names, load_distribution
from skrull.solver.metrics import work_ms
from skrull.solver.planning import solve
from skrull.solver.profile import load_profile
from skrull.solver.types import Defer, Parallel, Request

#: (profile, layout): 256 sequences per global batch on each
SETUPS = (
    ("h100-80g/qwen2.5-0.5b", Parallel(dp=4, cp=8)),
    ("h100-80g/qwen2.5-7b", Parallel(dp=2, cp=16)),
)
BATCH_SEQUENCES = 256
KS = (0, 2, 4, 8)


def draw_stream(dataset: str, parallel: Parallel, bucket_tokens: int, batches: int, seed: int) -> list[list[int]]:
    """``batches`` global batches of real-shaped lengths, cut at ``cp * bucket_tokens`` (an SFT loader's
    ``max_length``)."""
    rng = np.random.default_rng(seed)
    dist = load_distribution(dataset)
    limit = parallel.cp * bucket_tokens
    return [[int(x) for x in np.minimum(dist.sample(BATCH_SEQUENCES, rng), limit)] for _ in range(batches)]


def stream_ms_per_work(
    stream: list[list[int]], *, profile_name: str, parallel: Parallel, k: int, budget_s: float
) -> tuple[float, int]:
    """Time per unit of work of the stream planned one batch per request with deferral ``k``, and how many
    sequences waited."""
    profile = load_profile(profile_name)
    model = CostModel(profile)
    carried: list[int] = []
    total_ms = total_work = 0.0
    waited = 0
    for b, batch in enumerate(stream):
        last = b == len(stream) - 1
        lengths = [*carried, *batch]
        request = Request(
            batches=(tuple(lengths),),
            parallel=parallel,
            profile=profile,
            time_budget_s=budget_s,
            deterministic=True,
            defer=Defer(max_sequences=0 if last else k, carried=len(carried)) if k else None,
        )
        plan = solve(request)
        total_ms += plan.estimated_ms
        total_work += work_ms(plan, lengths, model)
        carried = [lengths[i] for i in plan.pending]
        waited += len(plan.pending)
    assert not carried
    return total_ms / total_work, waited


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=4, help="consecutive global batches per stream")
    parser.add_argument("--budget", type=float, default=0.1, help="time_budget_s of every request")
    parser.add_argument("--seed", type=int, default=None, help="default: from the clock (fresh streams)")
    parser.add_argument("--distributions", default=None, help="comma-separated (default: every bundled one)")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    names = args.distributions.split(",") if args.distributions else list(distribution_names())
    jobs = [(p, par, d) for p, par in SETUPS for d in names]
    rows: list[tuple[str, str, list[float], list[int]]] = []
    began = time.perf_counter()
    for n, (profile_name, parallel, dataset) in enumerate(tqdm(jobs, file=sys.stderr, leave=False, disable=None)):
        bucket = load_profile(profile_name).bucket_tokens
        stream = draw_stream(dataset, parallel, bucket, args.batches, seed * 1000 + n)
        ratios, waits = [], []
        for k in KS:
            ratio, waited = stream_ms_per_work(
                stream, profile_name=profile_name, parallel=parallel, k=k, budget_s=args.budget
            )
            ratios.append(ratio)
            waits.append(waited)
        layout = f"{profile_name.split('/')[-1]} DP{parallel.dp}xCP{parallel.cp}"
        rows.append((layout, dataset, ratios, waits))
    wall_s = time.perf_counter() - began
    today = datetime.date.today().isoformat()
    print(f"machine: {platform.machine()} {platform.processor() or ''} python {platform.python_version()}; {today}")
    print(
        f"seed {seed}; {len(jobs)} streams of {args.batches} x {BATCH_SEQUENCES} sequences; "
        f"time_budget_s {args.budget:g}, deterministic; {wall_s:.0f} s\n"
    )
    print("| layout | distribution | ms per work, k=0 | k=2 | k=4 | k=8 | sequences waited (k=2/4/8) |")
    print("|---|---|---|---|---|---|---|")
    for layout, dataset, ratios, waits in rows:
        rel = " | ".join(f"{r / ratios[0]:.4f}" for r in ratios[1:])
        print(f"| {layout} | {dataset} | {ratios[0]:.4f} | {rel} | {'/'.join(map(str, waits[1:]))} |")
    for j, k in enumerate(KS[1:], start=1):
        rel = [r[2][j] / r[2][0] for r in rows]
        print(f"\nk={k}: mean {statistics.fmean(rel):.4f}, best {min(rel):.4f}, worst {max(rel):.4f} (relative to k=0)")


if __name__ == "__main__":
    main()

"""Measured CPU execution of plans: one attention layer forward+backward per rank, gloo, DP2 x CP2.

Miniatures of real length distributions: a request is sampled for Qwen2.5-0.5B on H100 (bucket 26,000)
and every length and the bucket are divided by SCALE, which keeps the distribution's shape and the
plan's structure while fitting a 2-core CPU. Each plan runs once untimed (warm-up), then once timed;
the table gives per rank the fwd+bwd milliseconds and tokens/s (min / max over ranks) and the
iteration time (slowest rank). A CPU is not a GPU: attention is the float32 reference, the collectives
are gloo over loopback, and 4 processes share 2 cores, so only relative numbers mean anything.
Prints a Markdown table; asserts nothing. Run: python bench/execute.py [--scale 64] [--per-rank 8]
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import sys

from tqdm import tqdm

from skrull.solver.lengths.datasets import synthesize_request
from skrull.solver.planning import solve
from skrull.solver.profile import load_profile
from skrull.solver.types import Parallel, Problem
from skrull.worker.layer_check import ExecuteConfig, execute_plan

DATASETS = ("llama3-sft-mix", "chatqa2-long-sft")
SOLVERS = ("skrull", "deepspeed", "packed")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=int, default=64, help="divide lengths and bucket by this")
    parser.add_argument("--per-rank", type=int, default=8, help="sequences per DP rank")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    parallel = Parallel(dp=2, cp=2)
    profile = load_profile("h100-80g/qwen2.5-0.5b")
    bucket = profile.bucket_tokens // args.scale
    config = ExecuteConfig(warmup_passes=1)  # each microbatch runs its plan's mode (the requests': allgather)
    print(
        f"machine: {platform.machine()} {platform.processor() or ''}, {parallel.num_gpus} gloo processes; "
        f"lengths and bucket / {args.scale} (bucket {bucket}), {args.per_rank} sequences per DP rank, "
        f"layer hidden {config.layer.hidden_size}, {config.layer.num_heads} heads ({config.layer.num_kv_heads} KV), "
        "cp allgather (the plans' mode)\n"
    )
    print("| dataset | solver | tokens | microbatches | rank ms min / max | tokens/s per rank min / max | iter. ms |")
    print("|---|---|---|---|---|---|---|")
    for dataset in tqdm(DATASETS, desc="execute", file=sys.stderr, leave=False, disable=None):
        full = synthesize_request(
            dataset=dataset, parallel=parallel, profile=profile, sequences_per_rank=args.per_rank, seed=args.seed
        )
        batches = tuple(tuple(max(1, n // args.scale) for n in b) for b in full.batches)
        request = dataclasses.replace(full, batches=batches, bucket_tokens_override=bucket)
        lengths = Problem.from_request(request).lengths
        for solver in SOLVERS:
            plan = solve(dataclasses.replace(request, solver=solver))
            result = execute_plan(plan, lengths, world_size=parallel.num_gpus, config=config)
            ms = [t.seconds * 1e3 for t in result.timings]
            rates = [t.tokens_per_s for t in result.timings]
            num_mb = sum(len(it.microbatches) for it in plan.iterations)
            print(
                f"| {dataset} | {solver} | {sum(lengths)} | {num_mb} | {min(ms):.0f} / {max(ms):.0f} "
                f"| {min(rates):.0f} / {max(rates):.0f} | {max(ms):.0f} |"
            )


if __name__ == "__main__":
    main()

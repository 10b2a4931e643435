"""Planning latency of ``skrull``: p50/p99 of ``solve()`` (plan + estimate + validate) per global-batch
size, and the wall time of the whole ``skrull plan`` process for the largest one.

Sizes: 256 (DP4 x CP8 x 64), 4,096 (DP16 x CP8 x 256), 65,536 (DP64 x CP8 x 1,024) sequences.
Prints a Markdown table; asserts nothing. Run: python bench/latency.py [--dataset NAME]
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from skrull.solver.io import dumps, request_to_dict
from skrull.solver.lengths.datasets import synthesize_request
from skrull.solver.planning import solve
from skrull.solver.profile import load_profile
from skrull.solver.types import Parallel

SIZES = [(Parallel(dp=4, cp=8), 64, 200), (Parallel(dp=16, cp=8), 256, 30), (Parallel(dp=64, cp=8), 1024, 5)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--datasets", default="sharegpt,llama3-sft-mix,mooncake")
    parser.add_argument("--solver", default="skrull")
    args = parser.parse_args()
    profile = load_profile("h100-80g/qwen2.5-0.5b")
    print(f"machine: {platform.machine()} python {platform.python_version()}, solver {args.solver}\n")
    print("| dataset | sequences | layout | runs | p50 ms | p99 ms | `skrull plan` process s |")
    print("|---|---|---|---|---|---|---|")
    for dataset in args.datasets.split(","):
        for parallel, per_rank, runs in tqdm(
            SIZES, desc=f"latency {dataset}", file=sys.stderr, leave=False, disable=None
        ):
            times = []
            for seed in range(runs):
                request = synthesize_request(
                    dataset=dataset, parallel=parallel, profile=profile, sequences_per_rank=per_rank, seed=seed
                )
                request = dataclasses.replace(request, solver=args.solver)
                start = time.perf_counter()
                solve(request)
                times.append((time.perf_counter() - start) * 1e3)
            process_s = "-"
            if per_rank >= 1024:
                process_s = f"{_process_seconds(request):.2f}"
            n = parallel.dp * per_rank
            print(
                f"| {dataset} | {n} | DP{parallel.dp} x CP{parallel.cp} | {runs} | {np.percentile(times, 50):.2f} | "
                f"{np.percentile(times, 99):.2f} | {process_s} |"
            )


def _process_seconds(request: object) -> float:
    """Wall time of `skrull plan --request FILE -o OUT` in a fresh interpreter (start-up, read, plan, write)."""
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "request.json"
        req.write_text(dumps(request_to_dict(request), compact=True))  # type: ignore[arg-type]
        exe = Path(sys.executable).parent / "skrull"
        start = time.perf_counter()
        subprocess.run([str(exe), "plan", "-r", str(req), "--compact", "-o", str(Path(tmp) / "plan.json")], check=True)
        return time.perf_counter() - start


if __name__ == "__main__":
    main()

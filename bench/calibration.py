"""Calibration from the run: a tiny model on 4 gloo processes, starting from the bundled H100 profile.

The H100 profile is wrong for a CPU by orders of magnitude (it prices a microbatch in milliseconds that a
CPU runs in tens or hundreds). Phase 1 trains ``--iterations`` steps of a tiny Llama-shaped model
(examples/models/llama-tiny.json, random weights) under DP2 x CP2 with ``LoaderOptions(calibrate=True)``:
each rank times its microbatches (``scheduled_step(microbatch_ms=...)``), the loader gathers them and the
planner process refits the profile (worker/calibration.py); later requests are planned with the fit.
Per iteration: the profile its plan used, estimated vs measured iteration time and the median
per-microbatch error.

Phase 2 compares plans on the same data: the same ``--compare-iterations`` global batches (an order
phase 1 did not train on) planned with the starting profile and with the calibrated one, each run
``--rounds`` times alternating; reported: measured milliseconds per 1000 tokens (slowest rank's step,
summed over the iterations, over the tokens).

    python bench/calibration.py [--iterations 10] [--seed N]

Phase 3 replays phase 1's own measurements offline: for each iteration from the third after warm-up,
the profile is refitted on the iterations before it and predicts it, with recency weightings of several
half-lives (``HALF_LIFE_ITERATIONS`` the default) and weighing every iteration alike. All refits see the
same data, so their differences are the refit's, not the machine's (a shared host's load changes between
runs far more).

Prints Markdown; asserts nothing. Lengths: a bundled distribution's draw scaled into 32..1024 tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from budget import git_commit  # bench/budget.py

from skrull.solver.cost import CostModel
from skrull.solver.lengths.datasets import synthesize_request
from skrull.solver.profile import load_profile, profile_from_dict
from skrull.solver.types import Parallel
from skrull.worker.calibration import (
    HALF_LIFE_ITERATIONS,
    WARMUP_ITERATIONS,
    MeasuredMicrobatch,
    fit_profile,
    iteration_error,
    median_error,
)
from skrull.worker.collectives import GroupRegistry
from skrull.worker.dataloader import PlannedBatches
from skrull.worker.hf.model import build_model, read_model_config
from skrull.worker.hf.step import scheduled_step
from skrull.worker.kernels import select_kernel
from skrull.worker.launch import launch
from skrull.worker.loader_options import LoaderOptions
from skrull.worker.profiling.fit import FitError

ROOT = Path(__file__).resolve().parents[1]
START = "h100-80g/qwen2.5-0.5b"
PARALLEL = Parallel(dp=2, cp=2)
BUCKET_TOKENS = 768
GLOBAL_BATCH = 16


def draw_lengths(seed: int, count: int) -> list[int]:
    """A bundled distribution's lengths scaled into 32..1024 tokens (a tiny model's long tail on a CPU)."""
    request = synthesize_request(
        dataset="llama3-sft-mix", parallel=PARALLEL, profile=load_profile(START),
        sequences_per_rank=count // PARALLEL.dp, seed=seed,
    )  # fmt: skip
    raw = [s for b in request.batches for s in b]
    top = max(raw)
    out = [max(32, min(1024, round(1024 * s / top * 4))) for s in raw]
    random.Random(seed).shuffle(out)
    return out


def rank_groups() -> GroupRegistry:
    """Every group of two or more ranks (a plan may group any ranks: dynamic CP), in one order everywhere."""
    world = PARALLEL.num_gpus
    sets = [c for n in range(2, world + 1) for c in itertools.combinations(range(world), n)]
    return GroupRegistry.create(sets)


def train(loader: PlannedBatches, model: Any, registry: GroupRegistry, *, calibrate: bool) -> dict[str, Any]:
    device = torch.device("cpu")
    kernel = select_kernel(device, torch.float32)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    steps, reports = [], []
    for ready in loader:
        ms: list[float] = []
        optimizer.zero_grad()
        start = time.perf_counter()
        timings = ms if calibrate else None
        result = scheduled_step(
            model, ready.microbatches, registry=registry, kernel=kernel, device=device, microbatch_ms=timings
        )
        optimizer.step()
        seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        tokens = torch.tensor([result.tokens], dtype=torch.float64)
        dist.all_reduce(tokens)
        steps.append((float(seconds), float(tokens)))
        if calibrate:
            r = loader.record_timings(ready, ms)
            reports.append(
                {"iteration": r.iteration, "profile": r.profile, "estimated_ms": r.estimated_ms,
                 "measured_ms": r.measured_ms, "error": r.median_microbatch_error, "microbatches": r.microbatches}
            )  # fmt: skip
    return {"steps": steps, "reports": reports}


def rank_main(rank: int, world: int, backend: str, args: argparse.Namespace, out_dir: str) -> None:
    config = read_model_config(ROOT / "examples/models/llama-tiny.json")
    model = build_model(config, seed=0, device=torch.device("cpu"), dtype=torch.float32)
    registry = rank_groups()
    lengths = draw_lengths(args.seed, 600)
    vocab = int(config["vocab_size"])
    g = torch.Generator().manual_seed(args.seed)
    rows = [torch.randint(0, vocab, (n,), generator=g) for n in lengths]
    common = LoaderOptions(
        global_batch_size=GLOBAL_BATCH, profile=START, rank=rank, dp=PARALLEL.dp, cp=PARALLEL.cp,
        bucket_tokens=BUCKET_TOKENS, time_budget_s=0.2, seed=args.seed,
    )  # fmt: skip
    loader = PlannedBatches(rows, lengths, dataclasses.replace(common, num_iterations=args.iterations, calibrate=True))
    phase1 = train(loader, model, registry, calibrate=True)
    assert loader.calibration is not None
    summary = loader.calibration.summary_line()
    calibrated = loader.calibration.fitted_profile()
    measured = [dataclasses.asdict(mb) for mb, _ in loader.calibration.measured]
    loader.close()
    compare: dict[str, list[float]] = {"starting": [], "calibrated": []}
    for _ in range(args.rounds):
        for name, profile in (("starting", START), ("calibrated", calibrated)):
            options = dataclasses.replace(
                common, profile=profile, seed=args.seed + 1, num_iterations=args.compare_iterations
            )
            feed = PlannedBatches(rows, lengths, options)
            steps = train(feed, model, registry, calibrate=False)["steps"]
            feed.close()
            compare[name].append(sum(s for s, _ in steps[1:]) / sum(t for _, t in steps[1:]) * 1e6)
    if rank == 0:
        out = {"phase1": phase1, "summary": summary, "profile": calibrated, "compare": compare, "measured": measured}
        Path(out_dir, "result.json").write_text(json.dumps(out))


def replay(measured: list[dict[str, Any]]) -> dict[str, tuple[float, float, int]]:
    """Phase 3: one-iteration-ahead errors of the refit with and without recency, on the same measurements:
    per setting the median over predicted iterations of (median microbatch error, iteration error)."""
    mbs = [
        MeasuredMicrobatch(**{**m, "ranks": tuple(m["ranks"]), "local": tuple(tuple(x) for x in m["local"]),
                              "sharded": tuple(m["sharded"])})
        for m in measured
    ]  # fmt: skip
    iterations = sorted({mb.iteration for mb in mbs})
    out = {}
    halves = sorted({2.0, 4.0, 8.0, HALF_LIFE_ITERATIONS})
    settings = [
        (f"half-life {h:g} iterations{' (default)' if h == HALF_LIFE_ITERATIONS else ''}", h) for h in halves
    ] + [("every iteration alike", None)]
    for name, half_life in settings:
        mb_err, it_err = [], []
        for k in iterations[WARMUP_ITERATIONS + 2 :]:
            try:
                fit = fit_profile(load_profile(START), [mb for mb in mbs if mb.iteration < k],
                                  half_life_iterations=half_life)  # fmt: skip
            except FitError:
                continue
            model = CostModel(profile_from_dict(fit.profile))
            target = [mb for mb in mbs if mb.iteration == k]
            mb_err.append(median_error(target, model))
            it_err.append(iteration_error(target, model))
        out[name] = (
            statistics.median(mb_err) if mb_err else float("nan"),
            statistics.median(it_err) if it_err else float("nan"),
            len(mb_err),
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--compare-iterations", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--profile-out", default=None, help="write the calibrated profile here")
    args = parser.parse_args()
    if args.seed is None:
        args.seed = int(time.time()) % 100000
    with tempfile.TemporaryDirectory() as tmp:
        launch(rank_main, world_size=PARALLEL.num_gpus, backend="gloo", args=(args, tmp))
        out = json.loads(Path(tmp, "result.json").read_text())
    print("## Calibration from the run (CPU, gloo, 4 processes, tiny Llama, from the bundled H100 profile)\n")
    print(
        f"{platform.machine()} {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, {datetime.date.today()}, "
        f"commit {git_commit()}; DP{PARALLEL.dp} x CP{PARALLEL.cp}, global batch {GLOBAL_BATCH}, bucket "
        f"{BUCKET_TOKENS} tokens, seed {args.seed}\n"
    )
    print(
        "| iteration | plan's profile | estimated ms | measured ms | iteration error | median microbatch error "
        "| microbatches |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in out["phase1"]["reports"]:
        err = abs(r["estimated_ms"] - r["measured_ms"]) / r["measured_ms"]
        print(
            f"| {r['iteration']} | {r['profile']} | {r['estimated_ms']:.1f} | {r['measured_ms']:.1f} | {err:.1%} "
            f"| {r['error']:.1%} | {r['microbatches']} |"
        )
    print(f"\n{out['summary']}\n")
    c = out["compare"]
    start, cal = statistics.median(c["starting"]), statistics.median(c["calibrated"])
    print("| plans made with | ms per 1000 tokens (median of rounds) | rounds |")
    print("|---|---|---|")
    print(f"| starting profile ({START}) | {start:.2f} | {', '.join(f'{x:.2f}' for x in c['starting'])} |")
    print(f"| calibrated profile | {cal:.2f} | {', '.join(f'{x:.2f}' for x in c['calibrated'])} |")
    print(f"\ncalibrated vs starting: {(cal / start - 1) * 100:+.1f}% time per token")
    print("\nReplay of these measurements: each iteration predicted by a refit on the iterations before it\n")
    print("| refit | median microbatch error | iteration error | iterations predicted |")
    print("|---|---|---|---|")
    for name, (mb_err, it_err, n) in replay(out["measured"]).items():
        print(f"| {name} | {mb_err:.1%} | {it_err:.1%} | {n} |")
    if args.profile_out:
        Path(args.profile_out).write_text(json.dumps(out["profile"], indent=2) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

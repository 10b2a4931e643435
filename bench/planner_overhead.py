"""What planning beside training costs a host-bound loop: the loader with its defaults vs plans made beforehand.

The loop is rank 0 of DP2 x CP2 (Qwen2.5-0.5B's H100 profile, global batch 64, lengths drawn fresh from a
bundled distribution, 800 rows as in the issue that asked for this) doing a fixed ~100 ms of pure-Python
work per iteration that touches every microbatch it gets: a step that holds the interpreter lock all
along, as a GPU step launching kernels does. Three feeds:

- ``defaults``: ``PlannedBatches`` as a user writes it (the node's planner process, ``auto``, budgets from
  the measured step; a one-process gloo group stands for the job, so budgets are agreed as under torchrun);
- ``precomputed``: the same loader over plans solved before the loop starts (``LocalPlans``, waited for);
- ``no group (ranks given)``: the defaults as a loader without a ``torch.distributed`` group sees them (ranks
  given explicitly) under a launcher of one's own, one private planner per rank: each request at the
  planner's minimum for it (``unagreed_budget_s``);
- ``no group, one torchrun node``: ranks given explicitly, no group, under torchrun on one node (its
  environment set for this feed: local rank 0 of 4): the node's shared planner process, budgets derived
  from the measured step and agreed through that process (``ProcessPlans.compare_set``);
- ``thread (old default)``: plans made on a thread of the training process with the planner's default
  budget, what the loader did before the planner process (for comparison).

Reported per feed: median loop iteration (ms) and its excess over ``precomputed``, ``next()`` median
(``blocked_s``: every wait for a plan and the packing), the planner's CPU per iteration (the planner
process's own CPU clock, warm-up plan excluded) and how far ahead plans were ready (median lead over the
step, from when the planner solved a request to when the loop got its first iteration).
Each feed runs ``--rounds`` times, alternating, and the round with the median iteration is reported.
The first ``--warmup`` iterations (process start, first plans) are left out of the medians.

    python bench/planner_overhead.py [--iterations 40] [--step-ms 100] [--seed N]

Prints Markdown; asserts nothing (a shared machine's load moves every figure).
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
from typing import Any

import torch
import torch.distributed as dist
from budget import git_commit  # bench/budget.py

from skrull.solver.lengths.datasets import synthesize_request
from skrull.solver.profile import load_profile
from skrull.solver.types import Parallel
from skrull.worker.dataloader import PlannedBatches
from skrull.worker.loader_options import LoaderOptions
from skrull.worker.plan_sources import LocalPlans
from skrull.worker.planner.client import ProcessPlans

PROFILE = "h100-80g/qwen2.5-0.5b"
PARALLEL = Parallel(dp=2, cp=2)
ROWS = 800
GLOBAL_BATCH = 64


class Rows:
    """A map-style dataset of ``lengths`` rows of token ids (made on access, as a tokenized dataset reads)."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.arange(self.lengths[index], dtype=torch.long) % 32000


def busy_step(ready: Any, step_s: float) -> int:
    """~``step_s`` of Python work that reads every microbatch (holds the interpreter lock all along)."""
    end = time.perf_counter() + step_s
    touched = 0
    while time.perf_counter() < end:
        for mb in ready.microbatches:
            touched += int(mb.cu_seqlens[-1]) + mb.max_seqlen
    return touched


def run(loader: PlannedBatches, *, step_s: float, warmup: int) -> dict[str, Any]:
    periods, blocked = [], []
    used: dict[str, float] = {}  # plan id -> when the loop got its first iteration (time.monotonic)
    last = None
    for ready in loader:
        used.setdefault(ready.plan_id, time.monotonic())
        busy_step(ready, step_s)
        now = time.perf_counter()
        if ready.iteration >= warmup:
            if last is not None:
                periods.append(now - last)
            blocked.append(ready.blocked_s)
        last = now
    out: dict[str, Any] = {
        "iteration_ms": statistics.median(periods) * 1e3,
        "next_ms": statistics.median(blocked) * 1e3,
        "next_max_ms": max(blocked) * 1e3,
    }
    stats = getattr(loader.plans, "stats", None)
    if stats is not None:
        rows = [p for p in stats()["plans"] if p["solved"]]
        rows = rows[1:] if len(rows) > 1 else rows  # the first plan warms the process up
        iterations = sum(p["iterations"] for p in rows)
        out["cpu_ms_per_iteration"] = sum(p["cpu_s"] for p in rows) / max(iterations, 1) * 1e3
        leads = [used[p["key"]] - p["solved_at"] for p in rows if p["key"] in used and p["solved_at"] is not None]
        out["ahead_iterations"] = statistics.median(leads) / (out["iteration_ms"] / 1e3) if leads else None
        out["wall_ms_per_plan"] = statistics.median(p["wall_s"] for p in rows) * 1e3 if rows else None
        out["budgets_ms"] = sorted({round(p["budget_s"] * 1e3, 1) for p in rows if p["budget_s"]})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3, help="alternating runs of each feed (median reported)")
    parser.add_argument("--step-ms", type=float, default=100.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--dataset", default="llama3-sft-mix")
    parser.add_argument("--skip-thread", action="store_true", help="leave out the old in-process default")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else int(time.time()) % 100000
    profile = load_profile(PROFILE)
    request = synthesize_request(
        dataset=args.dataset, parallel=PARALLEL, profile=profile, sequences_per_rank=ROWS // PARALLEL.dp, seed=seed
    )
    lengths = [s for b in request.batches for s in b]
    random.Random(seed).shuffle(lengths)
    rows = Rows(lengths)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + seed % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)  # the job's store: budgets agreed as under torchrun
    options = LoaderOptions(
        global_batch_size=GLOBAL_BATCH, profile=PROFILE, seed=seed, rank=0, dp=PARALLEL.dp, cp=PARALLEL.cp,
        num_iterations=args.iterations,
    )  # fmt: skip
    step_s = args.step_ms / 1e3
    results: dict[str, dict[str, Any]] = {}

    pre = LocalPlans()
    fixed = PlannedBatches(rows, lengths, dataclasses.replace(options, time_budget_s=0.5), plans=pre)
    for chunk in range(len(fixed)):  # every plan solved before the loop starts
        pre.plan(pre.submit(fixed.request_document(chunk)), timeout_s=600)
    rounds: dict[str, list[dict[str, Any]]] = {
        "precomputed": [], "defaults": [], "no group (ranks given)": [], "no group, one torchrun node": [],
    }  # fmt: skip
    node_env = {
        "TORCHELASTIC_RUN_ID": f"bench-{seed}", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": str(PARALLEL.dp * PARALLEL.cp),
        "WORLD_SIZE": str(PARALLEL.dp * PARALLEL.cp), "GROUP_RANK": "0", "TORCHELASTIC_RESTART_COUNT": "0",
    }  # fmt: skip
    for _ in range(args.rounds):  # alternated, so drifting load hits both feeds alike
        fixed.next_iteration = 0
        rounds["precomputed"].append(run(fixed, step_s=step_s, warmup=args.warmup))
        loader = PlannedBatches(rows, lengths, options)
        rounds["defaults"].append(run(loader, step_s=step_s, warmup=args.warmup))
        loader.close()
        alone = PlannedBatches(rows, lengths, options)  # a launcher of one's own: no group to agree budgets through
        alone._budget_store, alone._budget_key = None, None
        rounds["no group (ranks given)"].append(run(alone, step_s=step_s, warmup=args.warmup))
        alone.close()
        saved = {k: os.environ.get(k) for k in node_env}
        os.environ.update(node_env)
        try:
            node = PlannedBatches(rows, lengths, options)  # the node's planner process, shared by its ranks
            shared = isinstance(node.plans, ProcessPlans) and node.plans.serves_whole_job(PARALLEL.dp * PARALLEL.cp)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        assert shared, "the feed's loader should ask the node's shared planner process"
        # as without a group (the bench's one-process group stands for the other feeds' job): agreed through
        # the node's planner process
        node._budget_store, node._budget_key = node.plans, f"skrull/plan-budget/{node.job_key}/{node.instance}"
        rounds["no group, one torchrun node"].append(run(node, step_s=step_s, warmup=args.warmup))
        node.close()
    fixed.close()
    pre.close()
    for name, runs in rounds.items():  # the round with the median loop iteration
        results[name] = sorted(runs, key=lambda r: r["iteration_ms"])[len(runs) // 2]

    if not args.skip_thread:
        thread = PlannedBatches(
            rows, lengths, dataclasses.replace(options, num_iterations=args.warmup + 10), plans=LocalPlans()
        )
        thread.time_budget_s = None
        thread._budget_key = None  # the old default: the planner's own budget for the request's size
        results["thread (old default)"] = run(thread, step_s=step_s, warmup=args.warmup)
        thread.close()
    dist.destroy_process_group()

    base = results["precomputed"]["iteration_ms"]
    print(f"## Planning beside a host-bound loop ({args.step_ms:g} ms of Python per iteration)\n")
    print(
        f"{platform.machine()} {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, "
        f"{datetime.date.today()}, commit {git_commit()}; rank 0 of DP{PARALLEL.dp} x CP{PARALLEL.cp}, {PROFILE}, "
        f"{ROWS} rows of {args.dataset} (seed {seed}), global batch {GLOBAL_BATCH}, "
        f"{args.iterations} iterations, first {args.warmup} left out\n"
    )
    print(
        "| feed | iteration ms (median) | vs precomputed | next() median ms | next() max ms "
        "| planner CPU ms / iteration | planner wall ms / plan | plans ready ahead (iterations) | budgets ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        cpu = f"{r['cpu_ms_per_iteration']:.1f}" if "cpu_ms_per_iteration" in r else "-"
        ahead = f"{r['ahead_iterations']:.1f}" if r.get("ahead_iterations") is not None else "-"
        budgets = ", ".join(f"{b:g}" for b in r.get("budgets_ms", [])) or "-"
        wall = f"{r['wall_ms_per_plan']:.1f}" if r.get("wall_ms_per_plan") is not None else "-"
        print(
            f"| {name} | {r['iteration_ms']:.1f} | {(r['iteration_ms'] / base - 1) * 100:+.1f}% | {r['next_ms']:.2f} | "
            f"{r['next_max_ms']:.1f} | {cpu} | {wall} | {ahead} | {budgets} |"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()

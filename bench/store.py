"""Solver throughput on the job store: jobs/s with 1, 2 and 4 solver processes, PostgreSQL vs SQLite.

For each backend and process count: a fresh store (a new PostgreSQL database, or a new SQLite file),
a ``SolverPool`` with N processes started and idle (warm), then a batch of distinct jobs submitted at
once; jobs/s = jobs / (time from the first submission until the last job is solved). This is the
path a ``skrull solver-worker`` takes (claim with SKIP LOCKED or SQLite's write lock, heartbeat,
publish, complete), without HTTP.

* ILP jobs: solver "ilp", time_budget_s = 1, DP4 x CP8 with 16 sequences per DP rank of
  llama3-sft-mix lengths, one batch: each solve is CPU-bound for about its budget.
* Heuristic jobs: solver "skrull" on the same shape: milliseconds of planning, so the store's
  per-job overhead (claim, publish, complete, notifications) dominates.

Prints tables and asserts nothing. On a 2-core machine ILP throughput can grow until 2 processes;
more processes share the same cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from skrull.api.schemas import canonical_request_json, job_id_for, request_from_document  # noqa: E402
from skrull.api.settings import Settings  # noqa: E402
from skrull.api.solvers.pool import SolverPool  # noqa: E402
from skrull.api.store.base import JobStore, NewJob  # noqa: E402
from skrull.api.store.open import open_store  # noqa: E402
from skrull.solver.io import parse_profile, request_to_dict  # noqa: E402
from skrull.solver.lengths.datasets import synthesize_request  # noqa: E402
from skrull.solver.types import Parallel  # noqa: E402

ADMIN_URL = os.environ.get("SKRULL_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


@contextlib.contextmanager
def location(backend: str) -> Iterator[str]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield str(Path(tmp) / "bench.db")
        return
    import psycopg

    name = f"skrull_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield ADMIN_URL.rpartition("/")[0] + f"/{name}"
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def new_job(*, solver: str, seed: int, time_budget_s: float) -> NewJob:
    request = synthesize_request(
        dataset="llama3-sft-mix",
        parallel=Parallel(dp=4, cp=8),
        profile=parse_profile("h100-80g/qwen2.5-0.5b"),
        sequences_per_rank=16,
        num_batches=1,
        seed=seed,
        bucket_tokens=None,
    )
    doc = {**request_to_dict(request), "solver": solver, "time_budget_s": time_budget_s}
    req = request_from_document(json.loads(json.dumps(doc)))
    canonical = canonical_request_json(req)
    return NewJob(
        job_id=job_id_for(canonical),
        request_json=canonical,
        solver=req.solver,
        num_iterations=len(req.batches),
        num_sequences=req.num_sequences,
        num_gpus=req.parallel.num_gpus,
        time_budget_s=req.time_budget_s,
    )


def run(backend: str, processes: int, jobs: list[NewJob]) -> tuple[float, int]:
    """(jobs/s, jobs solved) for one backend and process count."""
    with location(backend) as db:
        store: JobStore = open_store(db, pool_size=4)
        # the service's defaults (lease, attempts, hard limit 3 x budget + 10 s), with NORMAL SQLite syncs
        settings = Settings(db=db, sqlite_synchronous="NORMAL", solver_processes=processes, short_solver_processes=0)
        pool = SolverPool(settings, store=store, on_event=lambda event: None)
        pool.start()
        time.sleep(3.0)  # the processes import the planners and go idle
        start = time.perf_counter()
        for job in jobs:
            store.submit(job)
            pool.wake()
        while (counts := store.count_by_status()).get("solved", 0) + counts.get("failed", 0) < len(jobs):
            time.sleep(0.01)
        elapsed = time.perf_counter() - start
        pool.stop(grace_s=5)
        store.close()
    return len(jobs) / elapsed, counts.get("solved", 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", default="1,2,4")
    ap.add_argument("--ilp-jobs", type=int, default=8)
    ap.add_argument("--heuristic-jobs", type=int, default=200)
    args = ap.parse_args()
    counts = [int(x) for x in args.processes.split(",")]
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    seed = 1000
    for title, solver, budget, n, backends in (
        ("ILP jobs (solver ilp, time_budget_s=1)", "ilp", 1.0, args.ilp_jobs, ("postgres",)),
        ("heuristic jobs (solver skrull)", "skrull", 1.0, args.heuristic_jobs, ("postgres", "sqlite")),
    ):
        print(f"\n{title}: {n} jobs per run, DP4 x CP8, 16 sequences per DP rank")
        print(f"{'backend':<10} {'processes':>9} {'jobs/s':>8} {'solved':>7} {'speed-up':>9}")
        for backend in backends:
            base = None
            for k in counts:
                seed += n  # distinct jobs every run
                jobs = [new_job(solver=solver, seed=seed + i, time_budget_s=budget) for i in range(n)]
                rate, solved = run(backend, k, jobs)
                base = base or rate
                print(f"{backend:<10} {k:>9} {rate:>8.2f} {solved:>4}/{n:<2} {rate / base:>8.2f}x", flush=True)


if __name__ == "__main__":
    main()

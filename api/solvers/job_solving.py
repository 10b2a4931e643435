"""How a solver process turns one claimed job into stored iterations and a validated plan.

Multi-iteration requests for planners that declare ``streams_iterations`` (their plan of batch k depends
on batch k alone: ``solver.planners.base.Planner``) are solved one batch at a time with
``solver.planning.solve_batch``; each iteration is published at once, so workers can fetch iteration 0
while later ones are still being solved. A retried job resumes after the iterations already published.
Once every iteration is there, ``solver.planning.combine_iterations`` assembles and validates the whole
plan (the planning library's one way of doing so; its docstring says how the ``solve`` block combines).

Other planners (and single-batch requests) are solved whole with ``solver.planning.solve``.

Iterations and plans are stored as written by ``solver.io`` (``iteration_to_dict``, ``plan_to_dict``)
and read back with its readers, so what the service serves is exactly the plan that was solved.
"""

from __future__ import annotations

import hashlib
import json
import resource
import time
from collections.abc import Callable, Sequence
from typing import Any

from skrull.api.store.base import IterationRecord
from skrull.solver.io import iteration_from_dict, iteration_to_dict, plan_to_dict, request_from_dict
from skrull.solver.planning import IterationResult, combine_iterations, solve, solve_batch, streams_iterations
from skrull.solver.reports.compare import REFERENCE_SOLVER, compare, table_columns, table_rows
from skrull.solver.types import Plan, Request

PublishFn = Callable[[IterationRecord], bool]


class LeaseLostError(RuntimeError):
    """The job's lease was taken back (the server decided this process was gone): stop working on it."""


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def compact_json(doc: Any) -> str:
    return json.dumps(doc, separators=(",", ":"))


def to_record(job_id: str, result: IterationResult) -> IterationRecord:
    """An iteration as the store keeps it: the iteration document (``solver.io``) and its solve figures."""
    text = compact_json(iteration_to_dict(result.iteration))
    return IterationRecord(
        job_id=job_id,
        index=result.iteration.index,
        doc_json=text,
        digest=digest(text),
        wall_ms=result.wall_ms,
        status=result.status,
        bound_ms=result.bound_ms,
        pending_json=json.dumps(list(result.pending)),
    )


def from_record(record: IterationRecord) -> IterationResult:
    """``to_record``'s inverse."""
    return IterationResult(
        iteration=iteration_from_dict(json.loads(record.doc_json), field=f"iterations[{record.index}]"),
        wall_ms=record.wall_ms,
        status=record.status,
        bound_ms=record.bound_ms,
        pending=tuple(json.loads(record.pending_json)),
    )


def combine_records(request: Request, records: Sequence[IterationRecord]) -> Plan:
    """The whole plan from stored iterations (``solver.planning.combine_iterations``), validated."""
    return combine_iterations(request, [from_record(r) for r in records])


def solve_whole(job_id: str, request: Request) -> tuple[str, list[IterationRecord]]:
    """Solve the request in one call; the plan and its iterations as records."""
    plan = solve(request)
    records = [
        to_record(job_id, IterationResult(iteration=it, wall_ms=0.0, status=plan.solve.status))
        for it in plan.iterations
    ]
    return compact_json(plan_to_dict(plan)), records


def solve_streaming(
    job_id: str, request: Request, *, done: Sequence[IterationRecord], publish: PublishFn
) -> tuple[str, list[IterationRecord]]:
    """Solve batch by batch, publishing each iteration but the last (which ``complete`` stores with the
    plan, atomically); ``done`` are iterations published by an earlier attempt."""
    have = {r.index: r for r in done}
    records: list[IterationRecord] = []
    last = len(request.batches) - 1
    for k in range(len(request.batches)):
        if k in have:
            records.append(have[k])
            continue
        record = to_record(job_id, solve_batch(request, k))
        records.append(record)
        if k < last and not publish(record):
            raise LeaseLostError(job_id)
    plan_json = compact_json(plan_to_dict(combine_records(request, records)))
    unpublished = [r for r in records if r.index == last and last not in have]
    return plan_json, unpublished


def solve_job(
    job_id: str, request_json: str, *, done: Sequence[IterationRecord], publish: PublishFn
) -> tuple[str, list[IterationRecord]]:
    """Solve a stored job: the plan JSON and the iterations ``complete`` must store with it."""
    request = request_from_dict(json.loads(request_json))
    start_wall, start_cpu = time.perf_counter(), _cpu_s()
    if len(request.batches) > 1 and streams_iterations(request.solver):
        plan_json, rest = solve_streaming(job_id, request, done=done, publish=publish)
    else:
        plan_json, rest = solve_whole(job_id, request)
    wall_ms = 1000 * (time.perf_counter() - start_wall)
    cpu_ms = 1000 * (_cpu_s() - start_cpu)
    return with_cpu_time(plan_json, wall_ms=wall_ms, cpu_ms=cpu_ms, budget_s=request.resolved_time_budget_s), rest


#: A solve that received less than this share of the CPU time it ran for (or of its budget, if it ran for
#: longer) is flagged ``cpu_starved``: its plan is what a loaded machine could find, not what the budget buys.
STARVED_SHARE = 0.5
#: Solves shorter than this are never flagged (scheduling noise dominates).
STARVED_MIN_MS = 50.0


def _cpu_s() -> float:
    """CPU seconds of this thread (the solve; not the lease heartbeat) plus its reaped children (the exact
    solvers' forked children)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.thread_time() + children.ru_utime + children.ru_stime


def with_cpu_time(plan_json: str, *, wall_ms: float, cpu_ms: float, budget_s: float) -> str:
    """The plan with what its solve received in its ``solve`` block: ``cpu_ms`` (CPU time of the solving
    process and its children, this attempt) and ``cpu_starved`` (True when it received less than
    ``STARVED_SHARE`` of ``min(wall, budget)``: the machine was loaded, and a searching planner's plan and
    gap are worse than its budget promises; resubmit, or add solver capacity)."""
    doc = json.loads(plan_json)
    expected_ms = min(wall_ms, 1000 * budget_s)
    doc["solve"]["cpu_ms"] = round(cpu_ms, 3)
    doc["solve"]["cpu_starved"] = bool(expected_ms >= STARVED_MIN_MS and cpu_ms < STARVED_SHARE * expected_ms)
    return compact_json(doc)


def compare_table(request_json: str, solvers: Sequence[str] | None) -> dict[str, Any]:
    """``POST /v1/compare``'s answer (run in a separate process): one row per solver, table-shaped."""
    request = request_from_dict(json.loads(request_json))
    rows, _ = compare(request, solvers)
    return {
        "reference": REFERENCE_SOLVER,
        "num_sequences": request.num_sequences,
        "num_iterations": len(request.batches),
        "parallel": {"dp": request.parallel.dp, "cp": request.parallel.cp},
        "profile": request.profile.name,
        "bucket_tokens": request.bucket_tokens,
        "columns": table_columns(),
        "rows": table_rows(rows),
    }

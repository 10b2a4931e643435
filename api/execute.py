"""How a solver process turns one claimed job into stored iterations and a validated plan.

Multi-iteration requests for planners that plan each global batch independently (``stream_solvers``:
their plan of batch k depends on batch k alone) are solved one batch at a time: batch k becomes a
one-batch sub-request, its plan (already validated by ``solver.planning.solve``) is shifted to global
sequence ids (``id + offset_k``, ``offset_k`` = sequences in batches 0..k-1) and iteration index k, and
is published at once, so workers can fetch iteration 0 while later ones are still being solved. A
retried job resumes after the iterations already published.

Once every iteration is there, the whole plan is assembled from the stored JSON and validated against
the whole request with ``solver.validate.validate_plan`` before it is stored as solved. Its ``solve``
block covers all iterations: ``objective_ms`` = sum of iteration estimates; ``wall_ms`` = sum of the
per-batch solve times plus assembly and validation; ``bound_ms`` = sum of per-batch bounds when every
batch has one, ``gap = (objective - bound) / objective``; ``status`` is ``timeout`` if any batch timed
out, ``optimal`` if all are, ``feasible`` when a bound is known, else ``heuristic``. ``pending`` is the
union of the batches' deferred ids (planners that defer work across batches are never streamed).

Other planners (and single-batch requests) are solved whole with ``solver.planning.solve``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from skrull.api.store.base import IterationRecord
from skrull.solver.compare import REFERENCE_SOLVER, compare
from skrull.solver.io import plan_from_dict, plan_to_dict, request_from_dict
from skrull.solver.planning import solve
from skrull.solver.types import Request
from skrull.solver.validate import validate_plan

_COMPACT = {"separators": (",", ":")}

PublishFn = Callable[[IterationRecord], bool]


class LeaseLostError(RuntimeError):
    """The job's lease was taken back (the server decided this process was gone): stop working on it."""


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _shift_iteration(doc: dict[str, Any], *, offset: int, index: int) -> dict[str, Any]:
    """A one-batch plan's iteration, renumbered to global sequence ids and iteration ``index``."""
    return {
        **doc,
        "index": index,
        "microbatches": [
            {
                **mb,
                "local": [[i + offset for i in ids] for ids in mb["local"]],
                "sharded": [i + offset for i in mb["sharded"]],
            }
            for mb in doc["microbatches"]
        ],
    }


def _record(
    job_id: str,
    index: int,
    doc: dict[str, Any],
    *,
    wall_ms: float,
    status: str,
    bound_ms: float | None,
    pending: Sequence[int],
) -> IterationRecord:
    text = json.dumps(doc, **_COMPACT)  # type: ignore[arg-type]
    return IterationRecord(
        job_id=job_id,
        index=index,
        doc_json=text,
        digest=digest(text),
        wall_ms=wall_ms,
        status=status,
        bound_ms=bound_ms,
        pending_json=json.dumps(list(pending)),
    )


def combined_status(statuses: Sequence[str], bound_known: bool) -> str:
    if "timeout" in statuses:
        return "timeout"
    if statuses and all(s == "optimal" for s in statuses):
        return "optimal"
    return "feasible" if bound_known else "heuristic"


def assemble_plan_document(request: Request, records: Sequence[IterationRecord]) -> dict[str, Any]:
    """The whole plan from per-iteration records, validated against the whole request."""
    iterations = [json.loads(r.doc_json) for r in sorted(records, key=lambda r: r.index)]
    objective = round(sum(it["estimated_ms"] for it in iterations), 6)
    bounds = [r.bound_ms for r in records]
    bound = round(sum(b for b in bounds if b is not None), 6) if all(b is not None for b in bounds) else None
    gap = None
    if bound is not None:
        gap = round((objective - bound) / objective, 6) if objective > 0 else 0.0
    pending = sorted(i for r in records for i in json.loads(r.pending_json))
    doc = {
        "schema": "skrull.plan/v1",
        "solver": request.solver,
        "parallel": {"dp": request.parallel.dp, "cp": request.parallel.cp},
        "bucket_tokens": request.bucket_tokens,
        "iterations": iterations,
        "pending": pending,
        "solve": {
            "wall_ms": round(sum(r.wall_ms for r in records), 6),
            "status": combined_status([r.status for r in records], bound is not None),
            "objective_ms": objective,
            "bound_ms": bound,
            "gap": gap,
        },
    }
    validate_plan(plan_from_dict(doc), request)
    return doc


def solve_whole(job_id: str, request: Request) -> tuple[str, list[IterationRecord]]:
    """Solve the request in one call; the plan and its iterations as records."""
    plan = solve(request)
    doc = plan_to_dict(plan)
    records = [
        _record(job_id, it["index"], it, wall_ms=0.0, status=plan.solve.status, bound_ms=None, pending=())
        for it in doc["iterations"]
    ]
    return json.dumps(doc, **_COMPACT), records  # type: ignore[arg-type]


def solve_streaming(
    job_id: str, request: Request, *, done: Sequence[IterationRecord], publish: PublishFn
) -> tuple[str, list[IterationRecord]]:
    """Solve batch by batch, publishing each iteration but the last (which ``complete`` stores with the
    plan, atomically); ``done`` are iterations published by an earlier attempt."""
    have = {r.index: r for r in done}
    records: list[IterationRecord] = []
    unpublished: list[IterationRecord] = []
    num_batches = len(request.batches)
    offset = 0
    for k, batch in enumerate(request.batches):
        if k in have:
            records.append(have[k])
            offset += len(batch)
            continue
        sub = dataclasses.replace(request, batches=(batch,), time_budget_s=request.time_budget_s / num_batches)
        plan = solve(sub)
        it = _shift_iteration(plan_to_dict(plan)["iterations"][0], offset=offset, index=k)
        record = _record(
            job_id,
            k,
            it,
            wall_ms=plan.solve.wall_ms,
            status=plan.solve.status,
            bound_ms=plan.solve.bound_ms,
            pending=[i + offset for i in plan.pending],
        )
        records.append(record)
        if k < num_batches - 1:
            if not publish(record):
                raise LeaseLostError(job_id)
        else:
            unpublished.append(record)
        offset += len(batch)
    start = time.perf_counter()
    plan_doc = assemble_plan_document(request, records)
    # Assembling and validating the whole plan is part of solving it.
    plan_doc["solve"]["wall_ms"] = round(plan_doc["solve"]["wall_ms"] + (time.perf_counter() - start) * 1e3, 6)
    return json.dumps(plan_doc, **_COMPACT), unpublished  # type: ignore[arg-type]


def solve_job(
    job_id: str,
    request_json: str,
    *,
    stream_solvers: frozenset[str],
    done: Sequence[IterationRecord],
    publish: PublishFn,
) -> tuple[str, list[IterationRecord]]:
    """Solve a stored job: the plan JSON and the iterations ``complete`` must store with it."""
    request = request_from_dict(json.loads(request_json))
    if request.solver in stream_solvers and len(request.batches) > 1:
        return solve_streaming(job_id, request, done=done, publish=publish)
    return solve_whole(job_id, request)


def compare_table(request_json: str, solvers: Sequence[str] | None) -> dict[str, Any]:
    """``POST /v1/compare``'s answer (run in a separate process): one row per solver, table-shaped."""
    request = request_from_dict(json.loads(request_json))
    rows, _ = compare(request, solvers)
    columns = [
        "solver",
        "iteration_ms",
        "lower_bound_ms",
        "ratio_to_bound",
        "speedup",
        "planning_ms",
        "num_microbatches",
        "status",
        "error",
    ]
    return {
        "reference": REFERENCE_SOLVER,
        "num_sequences": request.num_sequences,
        "num_iterations": len(request.batches),
        "parallel": {"dp": request.parallel.dp, "cp": request.parallel.cp},
        "profile": request.profile.name,
        "bucket_tokens": request.bucket_tokens,
        "columns": columns,
        "rows": [[getattr(r, c) for c in columns] for r in rows],
    }

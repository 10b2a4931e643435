"""Rows to records, shared by the SQL backends: both select the same columns in the same order."""

from __future__ import annotations

from typing import Any

from skrull.api.store.base import IterationRecord, JobRecord

JOB_COLUMNS = (
    "id, status, solver, num_iterations, iterations_solved, num_sequences, num_gpus, time_budget_s, attempts, "
    "plan, error, last_error, created_at, updated_at, started_at, finished_at, lease_owner, lease_expires"
)
ITERATION_COLUMNS = "job_id, idx, doc, digest, wall_ms, status, bound_ms, pending"


def job_from_row(row: Any) -> JobRecord:
    """A ``JobRecord`` from a row selected with ``JOB_COLUMNS``."""
    return JobRecord(
        job_id=row[0],
        status=row[1],
        solver=row[2],
        num_iterations=row[3],
        iterations_solved=row[4],
        num_sequences=row[5],
        num_gpus=row[6],
        time_budget_s=row[7],
        attempts=row[8],
        plan_json=row[9],
        error_json=row[10],
        last_error_json=row[11],
        created_at=row[12],
        updated_at=row[13],
        started_at=row[14],
        finished_at=row[15],
        lease_owner=row[16],
        lease_expires=row[17],
    )


def iteration_from_row(row: Any) -> IterationRecord:
    """An ``IterationRecord`` from a row selected with ``ITERATION_COLUMNS``."""
    return IterationRecord(
        job_id=row[0],
        index=row[1],
        doc_json=row[2],
        digest=row[3],
        wall_ms=row[4],
        status=row[5],
        bound_ms=row[6],
        pending_json=row[7],
    )

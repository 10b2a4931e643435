"""``/v1/plans/{id}/ranks/{rank}?iteration=i``: one GPU's part of one iteration, with ETag and long-poll."""

from __future__ import annotations

import json
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from skrull.api.access import caller_tenant, require_plan_of_tenant
from skrull.api.errors import ApiProblem, invalid_field
from skrull.api.limits import check_wait
from skrull.api.routers.common import JSON, problems, service
from skrull.api.schemas import NotReady, RankViewModel
from skrull.api.service import Service
from skrull.api.store.base import IterationRecord, JobRecord
from skrull.api.views import RenderedView

# Every route here names a plan: visible only to its tenant (api.tenants).
router = APIRouter(prefix="/v1/plans", tags=["rank views"], dependencies=[Depends(require_plan_of_tenant)])


def _not_modified(request: Request, etag: str) -> bool:
    header = request.headers.get("if-none-match")
    if not header:
        return False
    tags = [t.strip() for t in header.split(",")]
    return etag in tags or "*" in tags or f"W/{etag}" in tags


@router.get(
    "/{plan_id}/ranks/{rank}",
    operation_id="getRankView",
    summary="One GPU's microbatches of one iteration (the worker view)",
    response_model=RankViewModel,
    responses={
        202: {"model": NotReady, "description": "the iteration is not solved yet; retry after Retry-After"},
        304: {"description": "not modified (If-None-Match matched the ETag)"},
        **problems(404, 409, 413, 422),
    },
)
async def get_rank_view(
    plan_id: str,
    rank: int,
    request: Request,
    iteration: Annotated[int, Query(description="iteration (global batch) index, 0-based")],
    wait: Annotated[
        float, Query(ge=0, description="long-poll: wait up to this many seconds for the iteration to be solved")
    ] = 0.0,
    page: Annotated[
        int,
        Query(
            ge=0,
            description="a view of more than SKRULL_MAX_VIEW_TOKENS JSON tokens is served in pages of whole "
            "microbatches; each page carries `page` and `pages`",
        ),
    ] = 0,
) -> Response:
    svc = service(request)
    wait = check_wait(wait, svc.settings)
    cached = svc.views.cached(plan_id, iteration, rank, page)
    if cached is not None:
        # Revalidated against the store (one indexed read, no render): a plan that failed or was deleted on
        # any replica, or on another server sharing the SQLite file, which sends no notification, is never
        # served from this cache; nor the old plan's views after a delete and resubmission under the same id.
        current = await svc.blocking(svc.store.get, plan_id)
        if current is not None and current.status != "failed" and svc.views.current(plan_id, current.created_at):
            return _answer(request, svc, cached.etag, cached.body)
        svc.views.forget(plan_id)

    job, view = await svc.blocking(_first_look, svc, plan_id, iteration, rank, page)
    if view is not None:  # solved already: one trip to the thread pool for the whole answer
        return _answer(request, svc, view.etag, view.body)
    if job is None:
        raise invalid_field("plan_id", plan_id, "no such plan", status=404, slug="unknown-plan")
    if job.status == "failed":  # also when some iterations were published before it failed
        raise _failed(job)
    if not 0 <= rank < job.num_gpus:
        raise invalid_field("rank", rank, f"must be in 0..{job.num_gpus - 1}", status=404, slug="unknown-rank")
    if not 0 <= iteration < job.num_iterations:
        raise invalid_field(
            "iteration", iteration, f"must be in 0..{job.num_iterations - 1}", status=404, slug="unknown-iteration"
        )

    with svc.long_poll(caller_tenant(request), wait):
        record, job = await _wait_for_iteration(svc, job, iteration, wait)
    if record is None:
        if job.status == "failed":
            raise _failed(job)
        body = NotReady(
            plan_id=plan_id,
            iteration=iteration,
            status=job.status,
            progress={"iterations_solved": job.iterations_solved, "iterations_total": job.num_iterations},
        )
        return Response(body.model_dump_json(), status_code=202, media_type=JSON, headers={"Retry-After": "1"})
    view = await svc.blocking(svc.views.render, record, rank, page)
    return _answer(request, svc, view.etag, view.body)


def _first_look(
    svc: Service, plan_id: str, iteration: int, rank: int, page: int
) -> tuple[JobRecord | None, RenderedView | None]:
    """Blocking: the job, and the rendered view when the rank and iteration exist and are solved (and the
    plan has not failed: a failed plan's views answer 409 even where an iteration was published)."""
    job = svc.store.get(plan_id)
    if job is None or job.status == "failed" or not (0 <= rank < job.num_gpus and 0 <= iteration < job.num_iterations):
        return job, None
    svc.views.current(plan_id, job.created_at)
    record = svc.store.iteration(plan_id, iteration)
    if record is None:
        return job, None
    view = svc.views.render(record, rank, page)
    after = svc.store.get(plan_id)  # a plan deleted or failed during a slow first render is not served
    if after is None or after.status == "failed" or after.created_at != job.created_at:
        svc.views.forget(plan_id)
        return after, None
    return after, view


def _failed(job: JobRecord) -> ApiProblem:
    error = json.loads(job.error_json) if job.error_json else None
    return ApiProblem(
        status=409,
        slug="plan-failed",
        title="plan failed",
        detail=f"plan {job.job_id} failed: {error['detail'] if error else 'unknown reason'}",
        plan_id=job.job_id,
        error=error,
    )


def _answer(request: Request, svc: Service, etag: str, body: bytes) -> Response:
    # A solved iteration never changes: caches may keep the view as long as they like.
    headers = {"ETag": etag, "Cache-Control": "private, max-age=31536000, immutable"}
    if _not_modified(request, etag):
        return Response(status_code=304, headers=headers)
    svc.metrics.plans_served.labels("rank_view").inc()
    return Response(body, media_type=JSON, headers=headers)


async def _wait_for_iteration(
    svc: Service, job: JobRecord, iteration: int, wait_s: float
) -> tuple[IterationRecord | None, JobRecord]:
    """The iteration's record once stored (or None when the job failed or ``wait_s`` passed)."""
    record = await svc.blocking(svc.store.iteration, job.job_id, iteration)
    if record is not None or wait_s <= 0 or job.is_final or svc.stopping:
        return record, job
    deadline = time.monotonic() + wait_s
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or svc.stopping:  # a stopping server answers every long-poll now (202, Retry-After)
            return None, job
        with svc.notifier.listen(job.job_id) as listener:
            record = await svc.blocking(svc.store.iteration, job.job_id, iteration)
            if record is not None:
                return record, job
            current = await svc.blocking(svc.store.get, job.job_id)
            if current is None:  # deleted while waited on
                raise invalid_field("plan_id", job.job_id, "no such plan (deleted)", status=404, slug="unknown-plan")
            job = current
            if job.is_final:
                record = await svc.blocking(svc.store.iteration, job.job_id, iteration)
                return record, job
            await listener.wait(min(remaining, svc.recheck_s))

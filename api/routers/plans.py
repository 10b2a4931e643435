"""``/v1/plans``: submit a request (202 + Location, idempotent), read the envelope (``?wait=S`` long-polls)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import Response

from skrull.api.access import caller_tenant, require_plan_of_tenant
from skrull.api.errors import invalid_field
from skrull.api.limits import check_request_limits, check_wait, validated_body
from skrull.api.routers.common import JSON, body_schema, problems, service
from skrull.api.schemas import PlanEnvelope, PlanRequestIn, request_document
from skrull.solver.jsonsafe import check_text

router = APIRouter(prefix="/v1/plans", tags=["plans"])


@router.post(
    "",
    status_code=202,
    operation_id="submitPlan",
    summary="Submit a planning request",
    response_model=PlanEnvelope,
    responses=problems(409, 413, 415, 422, 429, 503),
    openapi_extra=body_schema("PlanRequestIn"),
)
async def submit_plan(
    request: Request,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            max_length=256,
            description="resubmissions with the same key answer the "
            "same plan; the same key with a different request is refused (409)",
        ),
    ] = None,
) -> Response:
    """Validate synchronously, store the job and answer 202 with ``Location``. The plan id is the content
    address of the request: resubmitting the same request answers the same plan (a failed one is queued
    again)."""
    svc = service(request)
    if idempotency_key is not None:
        check_text(idempotency_key, "Idempotency-Key")
    body = await validated_body(request, PlanRequestIn)  # parsed and validated off the event loop
    check_request_limits(body, svc.settings)
    outcome = await svc.blocking(svc.submit, request_document(body), idempotency_key, caller_tenant(request))
    job = outcome.job
    svc.metrics.submissions.labels(
        "created" if outcome.created else "requeued" if outcome.requeued else "duplicate"
    ).inc()
    if (outcome.created or outcome.requeued) and svc.pool is not None:
        svc.pool.wake()
    headers = {"Location": f"/v1/plans/{job.job_id}"}
    if not outcome.created:
        headers["Idempotent-Replayed"] = "true"
    return Response(svc.envelope(job), status_code=202, media_type=JSON, headers=headers)


@router.get(
    "/{plan_id}",
    operation_id="getPlan",
    summary="Read a plan's status, progress and (once solved) the plan",
    response_model=PlanEnvelope,
    responses=problems(404, 422),
    dependencies=[Depends(require_plan_of_tenant)],
)
async def get_plan(
    plan_id: str,
    request: Request,
    wait: Annotated[
        float, Query(ge=0, description="long-poll: wait up to this many seconds for the status or progress to change")
    ] = 0.0,
    until: Annotated[
        Literal["change", "final"],
        Query(
            description="with wait: answer on any change of status or progress (change), or only once the plan is "
            "solved or failed (final)"
        ),
    ] = "change",
) -> Response:
    svc = service(request)
    wait = check_wait(wait, svc.settings)
    with svc.long_poll(caller_tenant(request), wait):
        job = await svc.wait_for_change(plan_id, wait, until_final=until == "final")
    if job is None:
        raise invalid_field("plan_id", plan_id, "no such plan", status=404, slug="unknown-plan")
    if job.status == "solved":
        svc.metrics.plans_served.labels("plan").inc()
    return Response(svc.envelope(job), media_type=JSON)


@router.delete(
    "/{plan_id}",
    status_code=204,
    operation_id="deletePlan",
    summary="Delete a plan, its iterations and the idempotency keys naming it (needs a submit token)",
    responses=problems(404),
    dependencies=[Depends(require_plan_of_tenant)],
)
async def delete_plan(plan_id: str, request: Request) -> Response:
    """A plan being solved is deleted too: its solver's results are then refused. Resubmitting the same
    request afterwards plans it afresh under the same id."""
    svc = service(request)
    if not await svc.blocking(svc.delete, plan_id):
        raise invalid_field("plan_id", plan_id, "no such plan", status=404, slug="unknown-plan")
    return Response(status_code=204)

"""``/v1/plans/{id}/timeline.svg`` and ``/v1/plans/{id}/view``: a plan drawn as a per-GPU timeline."""

from __future__ import annotations

import functools
import json
from html import escape
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from skrull.api.access import require_plan_of_tenant
from skrull.api.errors import ApiProblem, invalid_field
from skrull.api.pictures import timeline_svg, view_page
from skrull.api.routers.common import problems, service
from skrull.api.service import Service
from skrull.api.store.base import JobRecord

# Every route here names a plan: visible only to its tenant (api.tenants).
router = APIRouter(prefix="/v1/plans", tags=["pictures"], dependencies=[Depends(require_plan_of_tenant)])
SVG = "image/svg+xml"


def _load(svc: Service, plan_id: str) -> tuple[JobRecord | None, str | None]:
    job = svc.store.get(plan_id)
    return job, (svc.store.request_json(plan_id) if job is not None and job.plan_json is not None else None)


def _check_iterations(job: JobRecord, iterations: list[int] | None) -> None:
    for i in iterations or ():
        if not 0 <= i < job.num_iterations:
            raise invalid_field(
                "iteration", i, f"must be in 0..{job.num_iterations - 1}", status=404, slug="unknown-iteration"
            )


@router.get(
    "/{plan_id}/timeline.svg",
    operation_id="getPlanTimeline",
    summary="The solved plan as a per-GPU timeline (SVG)",
    response_class=Response,
    responses={200: {"content": {SVG: {}}}, **problems(404, 409, 413, 422)},
)
async def get_timeline(
    plan_id: str,
    request: Request,
    iteration: Annotated[list[int] | None, Query(description="iterations to draw (repeatable; default all)")] = None,
) -> Response:
    svc = service(request)
    job, request_json = await svc.blocking(_load, svc, plan_id)
    if job is None:
        raise invalid_field("plan_id", plan_id, "no such plan", status=404, slug="unknown-plan")
    _check_iterations(job, iteration)
    if job.plan_json is None or request_json is None:
        detail = json.loads(job.error_json).get("detail") if job.error_json else None
        raise ApiProblem(
            status=409,
            slug="plan-not-solved",
            title="plan not solved",
            detail=f"plan {plan_id} is {job.status}" + (f": {detail}" if detail else "; draw it once solved"),
            plan_id=plan_id,
        )
    svg = await svc.blocking(
        functools.partial(
            timeline_svg, max_bars=svc.settings.max_picture_bars, max_bytes=svc.settings.max_picture_bytes
        ),
        job,
        request_json,
        iteration,
    )
    return Response(svg, media_type=SVG, headers={"Cache-Control": "public, max-age=3600"})


@router.get(
    "/{plan_id}/view",
    operation_id="viewPlan",
    summary="A small HTML page of the plan with its timeline (reloads itself until solved)",
    response_class=Response,
    responses={200: {"content": {"text/html": {}}}, **problems(404, 422)},
)
async def view_plan(plan_id: str, request: Request) -> Response:
    svc = service(request)
    job, request_json = await svc.blocking(_load, svc, plan_id)
    if job is None:
        raise invalid_field("plan_id", plan_id, "no such plan", status=404, slug="unknown-plan")
    svg = None
    if job.plan_json is not None and request_json is not None:
        try:
            svg = await svc.blocking(
                functools.partial(
                    timeline_svg, max_bars=svc.settings.max_picture_bars, max_bytes=svc.settings.max_picture_bytes
                ),
                job,
                request_json,
            )
        except ApiProblem as problem:  # too large to draw: the page keeps its figures and says why
            svg = f'<p class="pending">{escape(problem.detail)}</p>'
    return Response(view_page(job, svg, request_json), media_type="text/html; charset=utf-8")

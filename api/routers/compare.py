"""``POST /v1/compare``: one request through several planners, answered as a table.

The planners run in separate processes (``api.solvers.compare_pool``: bounded waiting, a deadline that kills),
never on the event loop.
"""

from __future__ import annotations

import functools

from fastapi import APIRouter, Request
from fastapi.responses import Response

from skrull.api.access import caller_tenant
from skrull.api.errors import invalid_field
from skrull.api.limits import check_request_limits, validated_body
from skrull.api.routers.common import JSON, body_schema, problems, service
from skrull.api.schemas import CompareRequestIn, CompareTable, request_document
from skrull.api.solvers.job_solving import compare_table
from skrull.api.tenants import tenant_prefix
from skrull.solver.planners.registry import planner_names

router = APIRouter(prefix="/v1", tags=["compare"])


async def client_gone(request: Request) -> None:
    """Returns once the client has disconnected (the body was read already: what is left is the
    disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


@router.post(
    "/compare",
    operation_id="comparePlanners",
    summary="Plan one request with several planners and tabulate them on the reference cost model",
    response_model=CompareTable,
    responses=problems(413, 415, 422, 429, 503, 504),
    openapi_extra=body_schema("CompareRequestIn"),
)
async def compare_planners(request: Request) -> Response:
    svc = service(request)
    body = await validated_body(request, CompareRequestIn)  # parsed and validated off the event loop
    check_request_limits(body, svc.settings)
    known = planner_names()
    solvers = body.solvers
    if solvers is not None:
        if not solvers:
            raise invalid_field("solvers", solvers, "must name at least one solver (or be left out: all)")
        if len(solvers) > svc.settings.max_compare_solvers:
            raise invalid_field(
                "solvers",
                len(solvers),
                f"at most {svc.settings.max_compare_solvers} solvers (SKRULL_MAX_COMPARE_SOLVERS)",
                slug="limit-exceeded",
            )
        for k, name in enumerate(solvers):
            if name not in known:
                raise invalid_field(f"solvers[{k}]", name, f"unknown solver; known: {', '.join(known)}")
    num_sequences = sum(len(b) for b in body.batches)
    if num_sequences > svc.settings.max_compare_sequences:
        raise invalid_field(
            "batches",
            num_sequences,
            f"a compare may hold at most {svc.settings.max_compare_sequences} sequences; it runs every planner "
            "(SKRULL_MAX_COMPARE_SEQUENCES)",
            slug="limit-exceeded",
        )
    # without a budget every planner gets the same quick default (auto's), so the compare's time is bounded
    # (`skrull compare` on the command line gives the exact planners their own 60 s instead)
    tenant = caller_tenant(request)
    request_obj, canonical = await svc.blocking(
        functools.partial(svc.prepare, budget_solver="auto", tenant=tenant), request_document(body)
    )
    num_solvers = len(solvers or known) + 1
    assert request_obj.time_budget_s is not None
    timeout_s = svc.settings.hard_limit_s(request_obj.time_budget_s) * num_solvers
    # every planner gets the budget: the compare holds that many of the tenant's solver seconds while it runs
    solver_s = request_obj.time_budget_s * num_solvers
    in_store_s = await svc.blocking(svc.store.tenant_solver_s, tenant_prefix(tenant))
    svc.reserve_compare(tenant, solver_s, in_store_s=in_store_s)
    try:
        table = await svc.compare_pool().run(
            timeout_s,
            compare_table,
            canonical,
            solvers,
            tenant=tenant,
            max_per_tenant=svc.settings.tenant_max_compares,
            client_gone=functools.partial(client_gone, request),
        )
    finally:
        svc.release_compare(tenant, solver_s)
    return Response(CompareTable.model_validate(table).model_dump_json(), media_type=JSON)

"""``/healthz`` (liveness and readiness: the store answers, solver processes are alive) and ``/metrics``."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from skrull.api.access import require_metrics_access
from skrull.api.routers.common import JSON, problems, service
from skrull.api.schemas import Health

router = APIRouter(tags=["operations"])


@router.get(
    "/healthz",
    operation_id="health",
    summary="Health: 200 when the store answers and solver processes are up, else 503",
    response_model=Health,
    responses={503: {"model": Health, "description": "degraded"}},
)
async def health(request: Request) -> Response:
    svc = service(request)
    try:
        jobs = await svc.blocking(svc.store.count_by_status)
        store = "ok"
    except Exception as exc:  # the store is down: report it, do not fail the probe with a traceback
        jobs, store = {}, f"error: {type(exc).__name__}: {exc}"
    configured = svc.pool.num_processes if svc.pool is not None else 0
    alive = svc.pool.alive() if svc.pool is not None else 0
    ok = store == "ok" and (configured == 0 or alive > 0)
    body = Health(
        status="ok" if ok else "degraded",
        store=store,
        solver_processes={"configured": configured, "alive": alive},
        jobs=jobs,
    )
    return Response(body.model_dump_json(), status_code=200 if ok else 503, media_type=JSON)


@router.get(
    "/metrics",
    operation_id="metrics",
    summary="Prometheus metrics (text exposition format)",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}}, **problems(401, 403, 429)},
    dependencies=[Depends(require_metrics_access)],
)
async def metrics(request: Request) -> Response:
    svc = service(request)
    counts = await svc.blocking(svc.store.count_by_status)
    alive = svc.pool.alive() if svc.pool is not None else 0
    body = svc.metrics.render(jobs_by_status=counts, solver_processes=alive, long_polls=sum(svc.long_polls.values()))
    return Response(body, media_type=CONTENT_TYPE_LATEST)

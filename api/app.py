"""The application factory: ``create_app(settings)`` wires the store, solver pool, routers and errors.

Starting the app (its lifespan) opens the store (a SQLite file, or PostgreSQL shared with other
replicas and solver workers), takes back expired leases, starts the local solver processes (possibly
none) and, on PostgreSQL, watches job changes so long-polls answer whichever machine solved the job;
stopping it lets running solves finish briefly and queues unfinished jobs again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from skrull.api.access import AccessControl, Authenticate, require_access
from skrull.api.errors import install_error_handlers
from skrull.api.http_semantics import BoundedWrites, HeadAsGet, PrivateAnswers
from skrull.api.limits import BodySizeLimit, JsonBody
from skrull.api.metrics import Metrics, method_label
from skrull.api.notify import Notifier
from skrull.api.openapi import published_openapi
from skrull.api.profiles import ProfileCatalog
from skrull.api.routers import compare, health, pictures, plans, profiles, ranks
from skrull.api.routers.common import problems
from skrull.api.server import ReadDeadlineMiddleware, on_stop_signal
from skrull.api.service import Service
from skrull.api.settings import Settings
from skrull.api.solvers.pool import SolverPool, import_plugins
from skrull.api.store.open import open_store
from skrull.api.views import RankViews

API_VERSION = "1.0.0"
#: How long running solves may finish after SIGTERM before they are killed (their jobs queued again,
#: uncharged); with ``server.GRACEFUL_SHUTDOWN_S`` the server is gone within 5 s of the signal.
SHUTDOWN_GRACE_S = 2.0

DESCRIPTION = """Plans DP x CP data scheduling for long-context fine-tuning (Skrull GDS + DACP and baselines).

Training jobs POST the lengths of upcoming global batches; the service solves them in the background;
each GPU's worker fetches its own part of the plan (`/v1/plans/{id}/ranks/{rank}?iteration=i`).
Errors are `application/problem+json` naming the field and the value.
"""


class HttpMetrics:
    """ASGI middleware timing every request by route template, method and status code."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        code = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal code
            if message["type"] == "http.response.start":
                code = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            self.metrics.http_seconds.labels(template, method_label(scope["method"]), str(code)).observe(
                time.perf_counter() - start
            )


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    import_plugins(settings.plugin_modules)
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = await asyncio.to_thread(
            open_store, settings.db, sqlite_synchronous=settings.sqlite_synchronous, pool_size=settings.pg_pool_size
        )
        loop = asyncio.get_running_loop()
        svc = Service(
            settings=settings,
            store=store,
            metrics=metrics,
            notifier=Notifier(),
            views=RankViews(
                store,
                max_views=settings.rank_view_cache_entries,
                cache_bytes=settings.cache_bytes,
                max_view_tokens=settings.max_view_tokens,
            ),
            profiles=ProfileCatalog(
                store, max_profile_bytes=settings.max_profile_bytes, max_profiles=settings.tenant_max_profiles
            ),
            loop=loop,
        )
        pool = SolverPool(settings, store=store, on_event=svc.on_solver_event)
        svc.pool = pool
        app.state.service = svc
        stop_watching = store.watch(svc.on_store_change) if store.notifies else None
        await asyncio.to_thread(pool.start)
        sweeper = asyncio.create_task(svc.sweep_expired_forever()) if settings.plan_retention_s > 0 else None
        restore_signals = on_stop_signal(loop, svc.server_stopping)
        try:
            yield
        finally:
            restore_signals()
            svc.server_stopping()
            if sweeper is not None:
                sweeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sweeper
            if stop_watching is not None:
                await asyncio.to_thread(stop_watching)
            svc.notifier.notify_all()
            await asyncio.to_thread(pool.stop, grace_s=SHUTDOWN_GRACE_S)
            svc.close()
            store.close()

    app = FastAPI(
        title="Skrull planning service",
        version=API_VERSION,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url="/docs",
        openapi_url="/openapi.json",
    )
    install_error_handlers(app, on_problem=lambda status, slug: metrics.errors.labels(str(status), slug).inc())
    app.state.access = AccessControl(settings)
    guarded = {"dependencies": [Depends(require_access)], "responses": problems(401, 403, 429)}
    for router in (plans.router, ranks.router, pictures.router, compare.router, profiles.router):
        app.include_router(router, **guarded)  # type: ignore[arg-type]
    app.include_router(health.router)
    count_problem = lambda status, slug: metrics.errors.labels(str(status), slug).inc()  # noqa: E731
    app.add_middleware(JsonBody, on_problem=count_problem)
    app.add_middleware(
        BodySizeLimit,
        max_bytes=settings.max_body_bytes,
        on_problem=lambda status, slug: metrics.errors.labels(str(status), slug).inc(),
    )
    # authentication before the size limit and the JSON reader: no body is read for a caller refused
    app.add_middleware(Authenticate, access=app.state.access, on_problem=count_problem)
    app.add_middleware(BoundedWrites, write_timeout_s=settings.write_timeout_s)
    app.add_middleware(PrivateAnswers, enabled=app.state.access.enabled)
    app.add_middleware(HttpMetrics, metrics=metrics)
    app.add_middleware(HeadAsGet)
    app.add_middleware(ReadDeadlineMiddleware)  # outermost: it marks where each request ends (api/server.py)
    app.openapi = lambda: published_openapi(app, settings)  # type: ignore[method-assign]
    return app

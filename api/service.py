"""What the routers share: settings, the store, the solver pool, long-poll wake-ups, metrics, caches.

Store calls are blocking (short transactions); handlers run them in the thread pool (``blocking``), so
the event loop only ever waits on sockets and timers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool

from skrull.api.errors import ApiProblem
from skrull.api.metrics import Metrics
from skrull.api.notify import Notifier
from skrull.api.profiles import ProfileCatalog
from skrull.api.schemas import canonical_request_json, envelope_json, job_id_for, request_from_document
from skrull.api.settings import Settings
from skrull.api.solvers.compare_pool import ComparePool
from skrull.api.solvers.pool import Event, SolverPool, import_plugins
from skrull.api.store.base import (
    IdempotencyConflictError,
    JobRecord,
    JobStore,
    NewJob,
    QueueFullError,
    QuotaExceededError,
    SubmitOutcome,
    TenantQuota,
)
from skrull.api.tenants import DEFAULT_TENANT, scoped_key, tenant_prefix
from skrull.api.views import LRU, RankViews
from skrull.solver.planning import check_request
from skrull.solver.types import Request

#: Bytes of finished plans' envelopes kept in memory, shared by their readers.
DEFAULT_ENVELOPE_BYTES = 64 * 2**20

T = TypeVar("T")
log = logging.getLogger("skrull.api")

#: A long-poll re-reads the store at least this often (changes made by another server on the same store).
LONG_POLL_RECHECK_S = 1.0
#: ... and this often when the store pushes every change itself (PostgreSQL LISTEN/NOTIFY): the re-read
#: is then only a safety net for a listening connection that broke.
LONG_POLL_RECHECK_NOTIFIED_S = 10.0


def quota_problem(exc: QuotaExceededError) -> ApiProblem:
    """429 ``quota-exceeded``: this tenant's share is used up; other tenants are not affected."""
    return ApiProblem(
        status=429,
        slug="quota-exceeded",
        title="tenant quota exceeded",
        headers={"Retry-After": "5"},
        detail=str(exc),
        field=exc.setting,
        value=exc.used,
        limit=exc.limit,
        retry_after_s=5,
    )


@dataclass(slots=True)
class Service:
    settings: Settings
    store: JobStore
    metrics: Metrics
    notifier: Notifier
    views: RankViews
    profiles: ProfileCatalog
    pool: SolverPool | None = None
    loop: asyncio.AbstractEventLoop | None = None
    _compare_pool: ComparePool | None = field(default=None)
    #: Long-polls waiting now, by tenant (on the event loop only): each tenant's share of the server's
    #: connections is ``SKRULL_TENANT_MAX_LONG_POLLS``.
    long_polls: dict[str, int] = field(default_factory=dict)
    #: Solver seconds of the compares running or waiting on this server, by tenant (counted in its quota).
    compare_seconds: dict[str, float] = field(default_factory=dict)
    #: Set at SIGTERM (``server_stopping``): long-polls answer what they have at once, new ones do not wait.
    stopping: bool = False
    #: The running ``read_job`` per plan id (on the event loop only).
    _job_reads: dict[str, asyncio.Future[JobRecord | None]] = field(default_factory=dict)
    #: Envelopes of finished plans, shared by every reader (``envelope``).
    _envelopes: LRU[tuple[str, float], bytes] = field(
        default_factory=lambda: LRU(256, max_bytes=DEFAULT_ENVELOPE_BYTES)
    )
    #: Envelopes of plans not yet finished (small: no plan), by state, for the long-polls answered together.
    _live_envelopes: LRU[tuple[Any, ...], bytes] = field(default_factory=lambda: LRU(1024, max_bytes=4 * 2**20))

    def envelope(self, job: JobRecord) -> bytes:
        """The envelope of ``job`` as JSON. A finished plan's never changes until it is deleted or
        resubmitted (which changes ``updated_at``), so one copy is kept and shared by all its readers: a
        plan of several MB read by a hundred slow clients is held once, not a hundred times."""
        if not job.is_final:
            # one copy per state too: a thousand long-polls answered at one deadline share one rendering
            state = (job.job_id, job.updated_at, job.status, job.iterations_solved, job.attempts, job.last_error_json)
            body = self._live_envelopes.get(state)
            if body is None:
                body = envelope_json(job)
                self._live_envelopes.put(state, body, size=len(body))
            return body
        key = (job.job_id, job.updated_at)
        body = self._envelopes.get(key)
        if body is None:
            body = envelope_json(job)
            self._envelopes.put(key, body, size=len(body))
        return body

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return await run_in_threadpool(fn, *args)

    # -- submissions -----------------------------------------------------------------------------------

    def prepare(
        self, doc: dict[str, Any], *, budget_solver: str | None = None, tenant: str = DEFAULT_TENANT
    ) -> tuple[Request, str]:
        """Validate a request document (``tenant``'s profile names resolved); the request and its canonical
        JSON. A request without ``time_budget_s`` is stored with a planner's default (``budget_solver``'s,
        else its own planner's), at most SKRULL_MAX_TIME_BUDGET_S (``api.limits`` refused it if the planner
        needs more). A plan request also passes every check its planner makes before planning
        (``solver.planning.check_request``: the budget, ``cp_modes`` the planner plans, heads the CP group
        divides, ``defer``), so nothing accepted fails later for what it asked."""
        request = request_from_document(self.profiles.inline(doc, tenant))
        if request.time_budget_s is None:  # the job's hard limit and its id need the figure
            default = dataclasses.replace(request, solver=budget_solver or request.solver).resolved_time_budget_s
            request = dataclasses.replace(request, time_budget_s=min(default, self.settings.max_time_budget_s))
        if budget_solver is None:  # what the planner would refuse is refused now, not after the 202
            check_request(request)
        return request, canonical_request_json(request)

    def submit(self, doc: dict[str, Any], idempotency_key: str | None, tenant: str = DEFAULT_TENANT) -> SubmitOutcome:
        """Store a job under its id within ``tenant`` (``api.tenants``); Idempotency-Keys are the tenant's."""
        request, canonical = self.prepare(doc, tenant=tenant)
        job_id = job_id_for(canonical, tenant)
        job = NewJob(
            job_id=job_id,
            request_json=canonical,
            solver=request.solver,
            num_iterations=len(request.batches),
            num_sequences=request.num_sequences,
            num_gpus=request.parallel.num_gpus,
            time_budget_s=request.resolved_time_budget_s,
        )
        quota = TenantQuota(
            tenant=tenant_prefix(tenant),
            max_queued=self.tenant_max_queued,
            max_solver_s=self.settings.tenant_max_solver_s,
            held_elsewhere_s=self.compare_seconds.get(tenant, 0.0),
            max_idempotency_keys=self.settings.tenant_max_idempotency_keys,
        )
        try:
            return self.store.submit(
                job,
                idempotency_key=scoped_key(tenant, idempotency_key),
                max_queued=self.settings.max_queued_jobs,
                quota=quota,
            )
        except IdempotencyConflictError as exc:
            raise IdempotencyConflictError(idempotency_key or "", exc.job_id) from None
        except QuotaExceededError as exc:
            raise quota_problem(exc) from None
        except QueueFullError as exc:
            raise ApiProblem(
                status=503,
                slug="queue-full",
                title="queue full",
                headers={"Retry-After": "5"},
                detail=str(exc),
                limit=exc.max_queued,
            ) from None

    @property
    def tenant_max_queued(self) -> int:
        """Queued jobs one tenant may hold: its quota, and, where tokens name two tenants or more, at most its
        share of the shared queue (``tenant_queue_share * max_queued_jobs``), so one tenant cannot fill the
        queue for all (a server of one tenant lets it fill the queue)."""
        tenants = {*self.settings.submit_token_tenants.values(), *self.settings.read_token_tenants.values()}
        if len(tenants) < 2:
            return self.settings.tenant_max_queued_jobs
        share = max(1, int(self.settings.max_queued_jobs * self.settings.tenant_queue_share))
        return min(self.settings.tenant_max_queued_jobs, share)

    def reserve_compare(self, tenant: str, seconds: float, *, in_store_s: float) -> None:
        """Count a compare of ``seconds`` (its budget times its planners) in ``tenant``'s solver seconds while
        it runs, on top of the ``in_store_s`` its jobs hold (``store.tenant_solver_s``); 429 ``quota-exceeded``
        if that takes the tenant past ``tenant_max_solver_s``. On the event loop (checked and counted at
        once); ``release_compare`` gives them back."""
        held = in_store_s + self.compare_seconds.get(tenant, 0.0)
        if held + seconds > self.settings.tenant_max_solver_s:
            raise quota_problem(
                QuotaExceededError(
                    field="solver seconds (time budgets of queued and solving jobs and running compares)",
                    used=round(held, 3),
                    limit=self.settings.tenant_max_solver_s,
                    setting="SKRULL_TENANT_MAX_SOLVER_S",
                )
            )
        self.compare_seconds[tenant] = self.compare_seconds.get(tenant, 0.0) + seconds

    def release_compare(self, tenant: str, seconds: float) -> None:
        left = self.compare_seconds.get(tenant, 0.0) - seconds
        if left > 1e-9:
            self.compare_seconds[tenant] = left
        else:
            self.compare_seconds.pop(tenant, None)

    # -- retention -------------------------------------------------------------------------------------

    def delete(self, job_id: str) -> bool:
        deleted = self.store.delete(job_id)
        self.views.forget(job_id)
        if deleted:
            self.metrics.plans_deleted.labels("request").inc()
        return deleted

    def sweep_expired(self) -> list[str]:
        """Delete solved and failed plans older than ``plan_retention_s`` (blocking); their ids."""
        ids = self.store.expire(older_than_s=self.settings.plan_retention_s)
        for job_id in ids:
            self.views.forget(job_id)
        if ids:
            self.metrics.plans_deleted.labels("expired").inc(len(ids))
        return ids

    async def sweep_expired_forever(self) -> None:
        """Every ``retention_sweep_s``: the sweep, in the thread pool; a failed sweep is logged and retried."""
        while True:
            try:
                while len(await self.blocking(self.sweep_expired)) > 0:
                    pass  # a large backlog is deleted in batches, one transaction each
            except Exception:
                log.exception("deleting expired plans failed; retrying in %.0f s", self.settings.retention_sweep_s)
            await asyncio.sleep(self.settings.retention_sweep_s)

    # -- long-polls ------------------------------------------------------------------------------------

    async def read_job(self, job_id: str) -> JobRecord | None:
        """``store.get`` in the thread pool, one read at a time per job: every long-poll of a job that
        asks while a read of it is running shares that read (a thousand waiters on one plan are one read
        per recheck, not a thousand queued in the thread pool)."""
        task = self._job_reads.get(job_id)
        if task is None:
            task = asyncio.ensure_future(self.blocking(self.store.get, job_id))
            self._job_reads[job_id] = task

            def done(finished: asyncio.Future[JobRecord | None], key: str = job_id) -> None:
                if self._job_reads.get(key) is finished:
                    del self._job_reads[key]

            task.add_done_callback(done)
        return await asyncio.shield(task)

    async def wait_for_change(self, job_id: str, wait_s: float, *, until_final: bool = False) -> JobRecord | None:
        """The job, once its status or progress differs from when the call began (with ``until_final``: once
        it is solved or failed), or when ``wait_s`` passed: a recheck still running at the deadline is not
        waited for (the last state read is answered), so a loaded thread pool cannot stretch a long-poll."""
        deadline = time.monotonic() + wait_s
        job = await self.read_job(job_id)
        if job is None or wait_s <= 0 or job.is_final or self.stopping:
            return job
        baseline = None if until_final else job.state_token
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.stopping:  # a stopping server answers every long-poll now
                return job
            with self.notifier.listen(job_id) as listener:
                try:
                    current = await asyncio.wait_for(self.read_job(job_id), timeout=remaining)
                except TimeoutError:
                    return job
                if current is None:  # deleted while waited on
                    return None
                job = current
                if job.is_final or (baseline is not None and job.state_token != baseline):
                    return job
                await listener.wait(min(remaining, self.recheck_s))

    @contextlib.contextmanager
    def long_poll(self, tenant: str, wait_s: float) -> Iterator[None]:
        """Count one long-poll of ``tenant`` while it waits; past its share (``tenant_max_long_polls``) the
        request is refused at once with 429 ``quota-exceeded`` and ``Retry-After``, so one tenant's thousands of
        waiting requests cannot crowd out another tenant's first request (a GET without ``wait`` is never
        counted or refused)."""
        if wait_s <= 0:
            yield
            return
        held = self.long_polls.get(tenant, 0)
        limit = self.settings.tenant_max_long_polls
        if held >= limit:
            raise ApiProblem(
                status=429,
                slug="quota-exceeded",
                title="tenant quota exceeded",
                headers={"Retry-After": "1"},
                detail=f"this tenant has {held} long-polls waiting on this server, its share of "
                f"{limit} (SKRULL_TENANT_MAX_LONG_POLLS); retry after Retry-After, or poll with a smaller wait",
                field="wait",
                value=wait_s,
                limit=limit,
                retry_after_s=1,
            )
        self.long_polls[tenant] = held + 1
        try:
            yield
        finally:
            left = self.long_polls.get(tenant, 1) - 1
            if left > 0:
                self.long_polls[tenant] = left
            else:
                self.long_polls.pop(tenant, None)

    @property
    def recheck_s(self) -> float:
        return LONG_POLL_RECHECK_NOTIFIED_S if self.store.notifies else LONG_POLL_RECHECK_S

    def on_store_change(self, job_id: str) -> None:
        """Called from the store's watcher thread on any replica's change of ``job_id``: drop what this
        replica cached of it (it may have been deleted, expired, failed or resubmitted elsewhere), then wake
        the long-polls on it (on the loop)."""
        self.views.forget(job_id)
        if self.loop is not None and not self.loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self.loop.call_soon_threadsafe(self.notifier.notify, job_id)

    # -- solver events ---------------------------------------------------------------------------------

    def on_solver_event(self, event: Event) -> None:
        """Called from the pool's threads: count, then wake the long-polls on the job (on the loop)."""
        kind = event[0]
        if kind == "done":
            _, job_id, outcome, solver, seconds, recorded = event
            if outcome in ("solved", "failed") and not recorded:
                self.metrics.solve_seconds.labels(str(solver), str(outcome)).observe(float(seconds))
            if outcome == "failed":
                self.metrics.jobs_failed.labels("solve-error").inc()
                self.views.forget(str(job_id))
        elif kind == "recovered":
            _, job_id, status = event
            if status == "queued":
                self.metrics.jobs_retried.inc()
            else:
                self.metrics.jobs_failed.labels("solver-died").inc()
                self.views.forget(str(job_id))
        elif kind == "restarted":
            self.metrics.solver_restarts.inc()
            return
        else:
            job_id = event[1]
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.notifier.notify, str(job_id))

    # -- compare ---------------------------------------------------------------------------------------

    def compare_pool(self) -> ComparePool:
        if self._compare_pool is None:
            self._compare_pool = ComparePool(
                processes=self.settings.compare_processes,
                max_waiting=self.settings.max_queued_compares,
                initializer=import_plugins,
                initargs=(self.settings.plugin_modules,),
            )
        return self._compare_pool

    def server_stopping(self) -> None:
        """SIGTERM (or the end of the lifespan): running and waiting compares stop now and answer 503
        ``server-stopping``; long-polls are woken and answer what they have at once (on the event loop), so
        uvicorn's graceful wait finds no request left to cancel (a cancelled request is a plain-text 500)."""
        self.stopping = True
        if self._compare_pool is not None:
            self._compare_pool.stop_running()
        self.notifier.notify_all()

    def close(self) -> None:
        if self._compare_pool is not None:
            self._compare_pool.close()
            self._compare_pool = None

"""The job store's interface: durable jobs, their published iterations, and uploaded profiles.

Any backend (the embedded SQLite file here, a shared SQL server later) implements ``JobStore``. The
semantics every backend must keep:

* ``submit`` is idempotent: a job id is the content address of its canonical request, so the same
  request (or the same ``Idempotency-Key``) answers the job already stored; a key reused for a different
  request is refused. Resubmitting a failed request queues it again.
* Claiming is a lease: ``claim`` moves the oldest queued job to ``solving`` under an ``owner`` until
  ``lease_expires``; only the owner may ``heartbeat``, ``publish_iteration``, ``complete`` or ``fail``
  it, and each of those answers False once the lease was lost (taken back by ``recover_expired`` or
  ``release``), so a slow or stale solver can never overwrite a result. A backend with many servers
  claims with row locks that skip locked rows; SQLite serializes writers instead.
* The queue bound (``max_queued``) is checked inside ``submit``'s transaction, for new jobs and for
  re-queued failures alike; submissions on one store are serialized while they check it (SQLite's write
  lock; a transaction-scoped advisory lock on PostgreSQL), so no number of concurrent submitters on any
  number of replicas can push the queue past it. Jobs taken back from a vanished owner were accepted
  already and are queued again regardless.
* Change notifications: a backend that can push changes across machines (``notifies`` True, e.g.
  PostgreSQL's LISTEN/NOTIFY) wakes idle solver processes through ``wait_for_work`` as soon as a job is
  queued, and calls ``watch``'s callback with the job id whenever a job changes, so long-polls on any
  server answer at once. A backend without (``notifies`` False) sleeps in ``wait_for_work`` and its
  callers poll.
* Nothing accepted is lost: a job whose owner vanished (its process died, its server crashed) is queued
  again while it has attempts left (``attempts < max_attempts``), else failed with the reason. A job is
  never left ``solving`` without a live lease.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypedDict, Unpack


def is_postgres_url(db: str) -> bool:
    """Whether a ``--db`` / ``SKRULL_DB`` value names a PostgreSQL database (else a SQLite file). Here, not in
    ``store.open``, so the PostgreSQL store can use it without importing the module that imports it."""
    return db.startswith(("postgresql://", "postgres://"))


def is_store_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the store cannot answer now (and may later): SQLite busy, locked, full or
    unreadable (``sqlite3.OperationalError``); any PostgreSQL error (a server that is down or restarting, a
    connection cut, a pool with no connection to give, ``psycopg.Error``); an ``OSError`` from the store's
    files. The service answers these 503 ``store-unavailable`` with ``Retry-After``; a solver process that
    meets one gives its job back uncharged (``api.solvers.pool``)."""
    import sqlite3

    if isinstance(exc, (sqlite3.OperationalError, OSError)):
        return True
    psycopg = sys.modules.get("psycopg")  # loaded only where a PostgreSQL store is in use
    return psycopg is not None and isinstance(exc, psycopg.Error)


JobStatus = Literal["queued", "solving", "solved", "failed"]
JOB_STATUSES: tuple[str, ...] = ("queued", "solving", "solved", "failed")


class IdempotencyConflictError(ValueError):
    """An ``Idempotency-Key`` already names a different request."""

    def __init__(self, key: str, job_id: str) -> None:
        self.key = key
        self.job_id = job_id
        super().__init__(f"Idempotency-Key {key!r} already names plan {job_id}, submitted with a different request")


class ProfileConflictError(ValueError):
    """A profile name is already stored with different content."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"profile {name!r} is already stored with different values; upload it under a new name")


class ProfileQuotaError(ValueError):
    """An upload would take its tenant past its number of stored profiles."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"this tenant holds {limit} uploaded profiles, its quota (SKRULL_TENANT_MAX_PROFILES)")


def profile_scope_sql(scope: str, placeholder: str) -> tuple[str, str]:
    """A condition on ``name`` selecting the uploaded profiles of one tenant (``scope`` is its prefix,
    ``api.tenants.tenant_prefix``), with the LIKE pattern to bind to ``placeholder``: a named tenant's are
    stored as ``<prefix>:<name>``, the default tenant's as ``<name>`` (a name holds no ``:``)."""
    if scope:
        return f"name LIKE {placeholder}", f"{scope}:%"
    return f"name NOT LIKE {placeholder}", "%:%"


def scoped_profile_name(scope: str, name: str) -> str:
    """An uploaded profile's name as stored for the tenant of prefix ``scope``."""
    return f"{scope}:{name}" if scope else name


def unscoped_profile_name(scope: str, stored: str) -> str:
    return stored[len(scope) + 1 :] if scope else stored


class QueueFullError(ValueError):
    """A submission would create or re-queue a job while ``max_queued`` jobs are already queued."""

    def __init__(self, max_queued: int) -> None:
        self.max_queued = max_queued
        super().__init__(f"{max_queued} jobs are queued (SKRULL_MAX_QUEUED_JOBS); retry later")


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantQuota:
    """What one tenant may hold in the queue (``SKRULL_TENANT_MAX_QUEUED_JOBS``,
    ``SKRULL_TENANT_MAX_SOLVER_S``). ``tenant`` is the tenant's plan-id prefix (``api.tenants.tenant_prefix``;
    empty for the default tenant): the store tells a job's tenant from its id, so no column is needed."""

    tenant: str
    max_queued: int
    max_solver_s: float
    #: Solver seconds the tenant holds outside the store (its compares running on this server).
    held_elsewhere_s: float = 0.0
    #: Idempotency-Keys kept per tenant: past it, the tenant's oldest keys are forgotten.
    max_idempotency_keys: int | None = None


class SubmitLimits(TypedDict, total=False):
    """What a submission is held to besides the job itself: ``JobStore.submit``'s keyword arguments, named
    once here for the interface and every store. A limit left out (or None) does not apply."""

    #: the client's Idempotency-Key (tenant-scoped): the same key with another job is a conflict
    idempotency_key: str | None
    #: creating or re-queuing a job while this many are queued raises ``QueueFullError``
    max_queued: int | None
    #: the job's tenant's share of the queue and of solver seconds (``QuotaExceededError``)
    quota: TenantQuota | None


class QuotaExceededError(ValueError):
    """A submission would take its tenant past its quota of queued jobs or of solver seconds."""

    def __init__(self, *, field: str, used: float, limit: float, setting: str) -> None:
        self.field, self.used, self.limit, self.setting = field, used, limit, setting
        super().__init__(f"this tenant holds {used:g} {field} of its {limit:g} ({setting}); retry when some are solved")


def tenant_sql(column: str, *, find: str) -> str:
    """SQL naming a job's tenant from its id (``api.tenants``): the 8 hex digits before ``-``, or ''."""
    return f"CASE WHEN {find}({column}, '-') > 0 THEN substr({column}, 1, 8) ELSE '' END"


def fair_next_sql(*, find: str, lock: str = "", max_budget: str | None = None) -> str:
    """The queued job a solver takes next (``JobStore.submit``): its tenant has the fewest jobs solving, then
    was served least recently (``tenant_claims``), then the job is the oldest; ``lock`` is appended
    (PostgreSQL: ``FOR UPDATE OF j SKIP LOCKED``). With ``max_budget`` (a parameter placeholder), only jobs of
    at most that time budget (a solver process kept for short work). Selects ``seq`` and the tenant."""
    tenant_j = tenant_sql("j.id", find=find)
    short = f" AND j.time_budget_s <= {max_budget}" if max_budget else ""
    return (
        f"SELECT j.seq, {tenant_j} AS tenant FROM jobs j WHERE j.status = 'queued'{short} ORDER BY "
        f"(SELECT COUNT(*) FROM jobs s WHERE s.status = 'solving' AND {tenant_sql('s.id', find=find)} = {tenant_j}), "
        f"COALESCE((SELECT t.claimed_at FROM tenant_claims t WHERE t.tenant = {tenant_j}), 0), j.seq LIMIT 1 {lock}"
    ).strip()


def check_quota(quota: TenantQuota, *, queued: int, solver_s: float, adding_s: float) -> None:
    """Raise ``QuotaExceededError`` if one more job of ``adding_s`` budget takes the tenant past ``quota``
    (the solver seconds it holds elsewhere, ``held_elsewhere_s``, count too)."""
    solver_s += quota.held_elsewhere_s
    if queued >= quota.max_queued:
        raise QuotaExceededError(
            field="queued jobs", used=queued, limit=quota.max_queued, setting="SKRULL_TENANT_MAX_QUEUED_JOBS"
        )
    if solver_s + adding_s > quota.max_solver_s:
        raise QuotaExceededError(
            field="solver seconds (time budgets of queued and solving jobs)",
            used=round(solver_s, 3),
            limit=quota.max_solver_s,
            setting="SKRULL_TENANT_MAX_SOLVER_S",
        )


def take_back_decisions(
    rows: Sequence[tuple[str, int]], *, max_attempts: int, count_attempt: bool
) -> list[tuple[str, int | None]]:
    """What ``release`` and ``recover_expired`` do with each ``(job_id, attempts)`` taken back, on every backend:
    ``(job_id, attempts_used)`` for a job queued again (attempts left), ``(job_id, None)`` for one failed. An
    uncharged take-back (a stopping server, a store that failed under the solve) gives the claim's attempt
    back."""
    out: list[tuple[str, int | None]] = []
    for job_id, attempts in rows:
        used = attempts if count_attempt else attempts - 1
        out.append((job_id, used if used < max_attempts else None))
    return out


class DamagedRecordError(RuntimeError):
    """A stored row cannot be read back (a damaged page, or text that is no longer the JSON written)."""

    def __init__(self, job_id: str, reason: str) -> None:
        self.job_id = job_id
        self.reason = reason
        super().__init__(f"the stored plan {job_id} is damaged: {reason}")


@dataclass(frozen=True, slots=True, kw_only=True)
class NewJob:
    """What a submission stores: the canonical request (profile inlined) and its shape."""

    job_id: str
    request_json: str
    solver: str
    num_iterations: int
    num_sequences: int
    num_gpus: int
    time_budget_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRecord:
    job_id: str
    status: str
    solver: str
    num_iterations: int
    iterations_solved: int
    num_sequences: int
    num_gpus: int
    time_budget_s: float
    attempts: int
    plan_json: str | None
    error_json: str | None
    last_error_json: str | None
    created_at: float
    updated_at: float
    started_at: float | None
    finished_at: float | None
    lease_owner: str | None
    lease_expires: float | None

    @property
    def is_final(self) -> bool:
        return self.status in ("solved", "failed")

    @property
    def state_token(self) -> tuple[str, int]:
        """What a long-poll compares: it returns when status or progress moved."""
        return (self.status, self.iterations_solved)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimedJob:
    """A job leased to a solver process: the request, the attempt number, iterations already published."""

    job_id: str
    solver: str
    request_json: str
    attempts: int
    lease_expires: float


@dataclass(frozen=True, slots=True, kw_only=True)
class IterationRecord:
    """One solved iteration in the specification's JSON, plus how it was solved (for the plan's ``solve`` block)."""

    job_id: str
    index: int
    doc_json: str
    digest: str
    wall_ms: float
    status: str
    bound_ms: float | None
    pending_json: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitOutcome:
    job: JobRecord
    created: bool
    requeued: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Recovered:
    """A job taken back from a vanished owner: queued again, or failed when out of attempts."""

    job_id: str
    status: str


class JobStore(Protocol):
    """Durable jobs with leases. Methods are short transactions, safe to call from any thread."""

    #: Whether ``wait_for_work`` and ``watch`` are pushed by the store itself (from any machine).
    notifies: bool

    def submit(self, job: NewJob, **limits: Unpack[SubmitLimits]) -> SubmitOutcome:
        """Store a job (or answer the stored one). With ``max_queued``, creating or re-queuing a job while that
        many are queued raises ``QueueFullError``: counted and decided in the same transaction, serialized
        with every other submission on the store (all replicas), so the bound can never be exceeded. With
        ``quota``, the same holds for the job's tenant: its queued jobs, and the time budgets of its queued
        and solving jobs together (``QuotaExceededError``).

        ``claim`` is fair between tenants: it takes the oldest queued job of the tenant with the fewest jobs
        solving, and among those the one served least recently, so one tenant's backlog never holds another
        tenant's job for longer than the solves already running."""
        ...

    def get(self, job_id: str) -> JobRecord | None: ...

    def request_json(self, job_id: str) -> str | None: ...

    def claim(self, *, owner: str, lease_s: float, max_budget_s: float | None = None) -> ClaimedJob | None:
        """Lease the next queued job (``fair_next_sql``); with ``max_budget_s``, only a job of at most that
        time budget (the solver process kept for short work, ``SKRULL_SHORT_SOLVER_PROCESSES``)."""
        ...

    def tenant_solver_s(self, tenant: str) -> float:
        """The time budgets of ``tenant``'s queued and solving jobs together (its solver seconds held)."""
        ...

    def heartbeat(self, *, job_id: str, owner: str, lease_s: float) -> bool: ...

    def publish_iteration(self, record: IterationRecord, *, owner: str) -> bool: ...

    def complete(self, *, job_id: str, owner: str, plan_json: str, iterations: Sequence[IterationRecord] = ()) -> bool:
        """Store the validated whole plan (and any iterations not yet published) and mark the job solved."""
        ...

    def fail(self, *, job_id: str, owner: str | None, error_json: str) -> bool: ...

    def release(
        self, *, owner: str, reason_json: str, max_attempts: int, count_attempt: bool = True
    ) -> list[Recovered]:
        """Take back every job ``owner`` holds (its process died, or it is shutting down)."""
        ...

    def recover_expired(self, *, reason_json: str, max_attempts: int) -> list[Recovered]:
        """Take back every job whose lease has expired."""
        ...

    def solving_owned(self) -> list[JobRecord]: ...

    def iteration(self, job_id: str, index: int) -> IterationRecord | None: ...

    def iterations(self, job_id: str) -> list[IterationRecord]: ...

    def count_by_status(self) -> dict[str, int]: ...

    def delete(self, job_id: str) -> bool:
        """Remove a job, its iterations and the idempotency keys naming it; False when there was none.
        A solver still holding the job loses its lease (its results are refused)."""
        ...

    def expire(self, *, older_than_s: float, limit: int = 1000) -> list[str]:
        """Delete up to ``limit`` solved or failed jobs that finished more than ``older_than_s`` ago (by the
        store's clock); their ids."""
        ...

    def queue_depth(self) -> int: ...

    def put_profile(self, name: str, doc_json: str, *, scope: str = "", max_profiles: int | None = None) -> bool:
        """Store an uploaded profile of the tenant of prefix ``scope`` (``scoped_profile_name``); False when the
        identical profile is already stored. A new one past ``max_profiles`` of that tenant raises
        ``ProfileQuotaError`` (counted in the same transaction)."""
        ...

    def get_profile(self, name: str, *, scope: str = "") -> str | None: ...

    def profile_names(self, *, scope: str | None = None) -> list[str]:
        """Names of the uploaded profiles of the tenant of prefix ``scope`` (as that tenant names them), or
        every stored name when ``scope`` is None."""
        ...

    def wait_for_work(self, timeout_s: float) -> bool:
        """Block until a job may have been queued (True) or ``timeout_s`` passed (False)."""
        ...

    def watch(self, on_change: Callable[[str], None]) -> Callable[[], None]:
        """Call ``on_change(job_id)`` (from a background thread) whenever a job changes; returns a stop function."""
        ...

    def close(self) -> None: ...

"""The shared job store: one PostgreSQL database for any number of API replicas and solver workers.

Selected with ``--db postgresql://user@host/dbname`` (or ``SKRULL_DB``). The semantics are those of
``api.store.base``; what PostgreSQL adds:

* Claims take the oldest queued job with ``SELECT ... FOR UPDATE SKIP LOCKED``: concurrent claimers on
  any machine each lock a different row instead of queueing behind one another, and no job is handed
  to two of them.
* Lease times come from the database's clock (``clock_timestamp()``), so machines with skewed clocks
  agree on when a lease expired. Every owner-only write first locks the job row and checks the owner,
  so a stale owner whose lease was taken back is refused even while it races the recovery.
* ``recover_expired`` also skips locked rows: several supervisors (one per API replica and solver
  worker) may sweep at once; each expired job is taken back exactly once.
* LISTEN/NOTIFY: every change sends ``pg_notify('skrull_jobs', job_id)`` inside its transaction (so it
  is delivered on commit, never before); a job becoming claimable also notifies ``skrull_queue``. Idle
  solver processes wait on ``skrull_queue`` (``wait_for_work``); each API server watches
  ``skrull_jobs`` and wakes its long-polls (``watch``).
* Schema migrations (``api.store.migrations``) run under a transaction-scoped advisory lock, so
  replicas starting together migrate once.

Connections come from a small pool per process (``psycopg_pool``); the listening connections are
separate, in autocommit mode.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Unpack

import psycopg
from psycopg_pool import ConnectionPool

from skrull.api.store.base import (
    ClaimedJob,
    IdempotencyConflictError,
    IterationRecord,
    JobRecord,
    NewJob,
    ProfileConflictError,
    ProfileQuotaError,
    QueueFullError,
    Recovered,
    SubmitLimits,
    SubmitOutcome,
    check_quota,
    fair_next_sql,
    is_postgres_url,
    profile_scope_sql,
    scoped_profile_name,
    take_back_decisions,
    tenant_sql,
    unscoped_profile_name,
)
from skrull.api.store.migrations import Migration, check_ordered, pending
from skrull.api.store.rows import ITERATION_COLUMNS, JOB_COLUMNS, iteration_from_row, job_from_row

log = logging.getLogger("skrull.store")

JOBS_CHANNEL = "skrull_jobs"
QUEUE_CHANNEL = "skrull_queue"
#: Arbitrary constant naming the advisory lock that serializes migrations.
MIGRATION_LOCK_KEY = 0x5C5011
#: ... and the one that serializes bounded submissions (count, then queue) across replicas.
QUEUE_LOCK_KEY = 0x5C5012
#: ... and the one that serializes counting a tenant's profiles with adding one.
PROFILE_LOCK_KEY = 0x5C5013

#: Seconds to open one connection, and to wait for one from the pool while serving.
CONNECT_TIMEOUT_S = 3
POOL_WAIT_S = 3.0

#: The database's clock in epoch seconds (what every timestamp column holds).
NOW = "extract(epoch FROM clock_timestamp())::float8"

MIGRATIONS = (
    Migration(
        version=1,
        description="jobs, iterations, idempotency keys, profiles",
        statements=(
            """CREATE TABLE jobs (
                seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                id TEXT NOT NULL UNIQUE,
                status TEXT NOT NULL CHECK (status IN ('queued', 'solving', 'solved', 'failed')),
                solver TEXT NOT NULL,
                request TEXT NOT NULL,
                num_iterations INTEGER NOT NULL,
                iterations_solved INTEGER NOT NULL DEFAULT 0,
                num_sequences INTEGER NOT NULL,
                num_gpus INTEGER NOT NULL,
                time_budget_s DOUBLE PRECISION NOT NULL,
                attempts INTEGER NOT NULL DEFAULT 0,
                plan TEXT,
                error TEXT,
                last_error TEXT,
                lease_owner TEXT,
                lease_expires DOUBLE PRECISION,
                created_at DOUBLE PRECISION NOT NULL,
                updated_at DOUBLE PRECISION NOT NULL,
                started_at DOUBLE PRECISION,
                finished_at DOUBLE PRECISION
            )""",
            "CREATE INDEX jobs_queued ON jobs (seq) WHERE status = 'queued'",
            "CREATE INDEX jobs_solving ON jobs (lease_expires) WHERE status = 'solving'",
            "CREATE INDEX jobs_by_status ON jobs (status)",
            """CREATE TABLE iterations (
                job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
                idx INTEGER NOT NULL,
                doc TEXT NOT NULL,
                digest TEXT NOT NULL,
                wall_ms DOUBLE PRECISION NOT NULL,
                status TEXT NOT NULL,
                bound_ms DOUBLE PRECISION,
                pending TEXT NOT NULL,
                PRIMARY KEY (job_id, idx)
            )""",
            """CREATE TABLE idempotency_keys (
                key TEXT PRIMARY KEY,
                job_id TEXT NOT NULL,
                created_at DOUBLE PRECISION NOT NULL
            )""",
            """CREATE TABLE profiles (
                name TEXT PRIMARY KEY,
                doc TEXT NOT NULL,
                created_at DOUBLE PRECISION NOT NULL
            )""",
        ),
    ),
    Migration(
        version=2,
        description="when each tenant's job was last claimed (fair claims)",
        statements=("CREATE TABLE tenant_claims (tenant TEXT PRIMARY KEY, claimed_at DOUBLE PRECISION NOT NULL)",),
    ),
    Migration(
        version=3,
        description="each Idempotency-Key's tenant (bounded per tenant)",
        statements=(
            "ALTER TABLE idempotency_keys ADD COLUMN tenant TEXT NOT NULL DEFAULT ''",
            "UPDATE idempotency_keys SET tenant = substr(key, 1, 8) WHERE key ~ '^[0-9a-f]{8}:'",
            "CREATE INDEX idempotency_keys_by_tenant ON idempotency_keys (tenant, created_at)",
        ),
    ),
)
_TENANT = tenant_sql("id", find="strpos")
_FAIR_NEXT = fair_next_sql(find="strpos", lock="FOR UPDATE OF j SKIP LOCKED")
_FAIR_NEXT_SHORT = fair_next_sql(find="strpos", lock="FOR UPDATE OF j SKIP LOCKED", max_budget="%s")
SCHEMA_VERSION = check_ordered(MIGRATIONS)


def _notify(conn: psycopg.Connection[Any], job_id: str, *, queued: bool = False) -> None:
    conn.execute("SELECT pg_notify(%s, %s)", (JOBS_CHANNEL, job_id))
    if queued:
        conn.execute("SELECT pg_notify(%s, '')", (QUEUE_CHANNEL,))


def _connect_failure(url: str, pool_error: Exception, timeout_s: float) -> str:
    """One line for a failed start: the server's own reason when it answered (a missing role or
    database, a wrong password), else that it could not be reached. The pool only reports a timeout,
    so one direct connection asks for the reason."""
    try:
        psycopg.connect(url, connect_timeout=max(1, round(timeout_s))).close()
    except psycopg.Error as exc:
        reason = " ".join(str(exc).split())
        if "FATAL" in reason:
            return f"db: PostgreSQL at {_redacted(url)} refused the connection: {reason[reason.index('FATAL') :]}"
        return f"db: cannot reach PostgreSQL at {_redacted(url)}: {reason}"
    return f"db: cannot reach PostgreSQL at {_redacted(url)}: {pool_error}"


class PostgresJobStore:
    """``JobStore`` on a PostgreSQL database (see the module docstring)."""

    notifies = True

    def __init__(self, url: str, *, pool_size: int = 8, connect_timeout_s: float = 10.0) -> None:
        if not is_postgres_url(url):
            raise ValueError(f"db: {url!r}: a PostgreSQL URL starts with postgresql://")
        self.url = url
        # Every connection is checked as it is handed out (``check``): one the server dropped (a restart, a
        # failover, an idle timeout) is replaced there, never handed to a request to fail on.
        self._pool = ConnectionPool(
            url,
            min_size=1,
            max_size=max(1, pool_size),
            open=False,
            name="skrull",
            timeout=connect_timeout_s,
            check=ConnectionPool.check_connection,
            kwargs={"connect_timeout": CONNECT_TIMEOUT_S},
        )
        try:
            self._pool.open(wait=True, timeout=connect_timeout_s)
        except Exception as exc:
            self._pool.close()
            raise ConnectionError(_connect_failure(url, exc, connect_timeout_s)) from None
        # Once serving, a store call waits at most this long for a connection: an unreachable server answers
        # 503 store-unavailable in seconds (api.errors), not after a client gave up.
        self._pool.timeout = POOL_WAIT_S
        self._listen_conn: psycopg.Connection[Any] | None = None
        self._migrate()

    def _migrate(self) -> None:
        with self._pool.connection() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, description TEXT NOT NULL, "
                f"applied_at DOUBLE PRECISION NOT NULL DEFAULT {NOW})"
            )
            row = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()
            for step in pending(MIGRATIONS, current=int(row[0] if row else 0)):
                for statement in step.statements:
                    conn.execute(statement)  # migration text from this module, never user input
                conn.execute(
                    "INSERT INTO schema_version (version, description) VALUES (%s, %s)",
                    (step.version, step.description),
                )
                log.info("job store migrated to schema version %d: %s", step.version, step.description)

    def schema_version(self) -> int:
        with self._pool.connection() as conn:
            row = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()
        return int(row[0]) if row else 0

    @contextlib.contextmanager
    def _tx(self) -> Iterator[psycopg.Connection[Any]]:
        """One transaction: committed when the block ends, rolled back when it raises."""
        with self._pool.connection() as conn:
            yield conn

    def close(self) -> None:
        if self._listen_conn is not None:
            with contextlib.suppress(Exception):
                self._listen_conn.close()
            self._listen_conn = None
        self._pool.close()

    # -- jobs ------------------------------------------------------------------------------------------

    def submit(self, job: NewJob, **limits: Unpack[SubmitLimits]) -> SubmitOutcome:
        idempotency_key, max_queued, quota = (
            limits.get("idempotency_key"),
            limits.get("max_queued"),
            limits.get("quota"),
        )
        created = requeued = False
        with self._tx() as conn:
            if max_queued is not None or quota is not None:
                status = conn.execute("SELECT status FROM jobs WHERE id = %s", (job.job_id,)).fetchone()
                if status is None or status[0] == "failed":
                    # Held until commit: the count below sees every bounded submission committed before it,
                    # and none can commit between this count and this insert (READ COMMITTED, any replica).
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (QUEUE_LOCK_KEY,))
                    # Looked at again under the lock: a concurrent submission of the same request may have
                    # queued it meanwhile, and this one is then a duplicate that adds nothing.
                    status = conn.execute("SELECT status FROM jobs WHERE id = %s", (job.job_id,)).fetchone()
                    row = conn.execute("SELECT COUNT(*) FROM jobs WHERE status = 'queued'").fetchone()
                    adds = status is None or status[0] == "failed"
                    if max_queued is not None and adds and row is not None and int(row[0]) >= max_queued:
                        raise QueueFullError(max_queued)
                    if quota is not None and adds:
                        held = conn.execute(
                            "SELECT COUNT(*) FILTER (WHERE status = 'queued'), COALESCE(SUM(time_budget_s), 0) "
                            f"FROM jobs WHERE status IN ('queued', 'solving') AND {_TENANT} = %s",
                            (quota.tenant,),
                        ).fetchone()
                        assert held is not None
                        check_quota(quota, queued=int(held[0]), solver_s=float(held[1]), adding_s=job.time_budget_s)
            if idempotency_key is not None:
                tenant = quota.tenant if quota is not None else ""
                added = conn.execute(
                    f"INSERT INTO idempotency_keys (key, job_id, created_at, tenant) VALUES (%s, %s, {NOW}, %s) "
                    "ON CONFLICT (key) DO NOTHING RETURNING key",
                    (idempotency_key, job.job_id, tenant),
                ).fetchone()
                row = conn.execute("SELECT job_id FROM idempotency_keys WHERE key = %s", (idempotency_key,)).fetchone()
                if row is not None and row[0] != job.job_id:
                    raise IdempotencyConflictError(idempotency_key, row[0])
                if added is not None and quota is not None and quota.max_idempotency_keys is not None:
                    conn.execute(  # the tenant's newest keys are kept; older ones are forgotten
                        "DELETE FROM idempotency_keys WHERE key IN (SELECT key FROM idempotency_keys WHERE tenant = %s "
                        "ORDER BY created_at DESC, key OFFSET %s)",
                        (tenant, quota.max_idempotency_keys),
                    )
            inserted = conn.execute(
                "INSERT INTO jobs (id, status, solver, request, num_iterations, num_sequences, num_gpus, "
                f"time_budget_s, created_at, updated_at) VALUES (%s, 'queued', %s, %s, %s, %s, %s, %s, {NOW}, {NOW}) "
                "ON CONFLICT (id) DO NOTHING RETURNING id",
                (
                    job.job_id,
                    job.solver,
                    job.request_json,
                    job.num_iterations,
                    job.num_sequences,
                    job.num_gpus,
                    job.time_budget_s,
                ),
            ).fetchone()
            if inserted is not None:
                created = True
            else:
                # A resubmitted failure is a fresh try; iterations published before the failure stay valid.
                requeued = (
                    conn.execute(
                        "UPDATE jobs SET status = 'queued', attempts = 0, last_error = error, error = NULL, "
                        f"finished_at = NULL, updated_at = {NOW} WHERE id = %s AND status = 'failed' RETURNING id",
                        (job.job_id,),
                    ).fetchone()
                    is not None
                )
            if created or requeued:
                _notify(conn, job.job_id, queued=True)
            record = conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = %s", (job.job_id,)).fetchone()
        return SubmitOutcome(job=job_from_row(record), created=created, requeued=requeued)

    def get(self, job_id: str) -> JobRecord | None:
        with self._tx() as conn:
            row = conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = %s", (job_id,)).fetchone()
        return None if row is None else job_from_row(row)

    def request_json(self, job_id: str) -> str | None:
        with self._tx() as conn:
            row = conn.execute("SELECT request FROM jobs WHERE id = %s", (job_id,)).fetchone()
        return None if row is None else str(row[0])

    def claim(self, *, owner: str, lease_s: float, max_budget_s: float | None = None) -> ClaimedJob | None:
        with self._tx() as conn:
            if max_budget_s is None:
                nxt = conn.execute(_FAIR_NEXT).fetchone()
            else:
                nxt = conn.execute(_FAIR_NEXT_SHORT, (max_budget_s,)).fetchone()
            if nxt is None:
                return None
            row = conn.execute(
                f"UPDATE jobs SET status = 'solving', lease_owner = %s, lease_expires = {NOW} + %s, "
                f"attempts = attempts + 1, started_at = {NOW}, updated_at = {NOW} WHERE seq = %s "
                "RETURNING id, solver, request, attempts, lease_expires",
                (owner, lease_s, nxt[0]),
            ).fetchone()
            conn.execute(
                f"INSERT INTO tenant_claims (tenant, claimed_at) VALUES (%s, {NOW}) "
                "ON CONFLICT (tenant) DO UPDATE SET claimed_at = excluded.claimed_at",
                (nxt[1],),
            )
            if row is not None:
                _notify(conn, row[0])
        if row is None:
            return None
        return ClaimedJob(job_id=row[0], solver=row[1], request_json=row[2], attempts=row[3], lease_expires=row[4])

    def tenant_solver_s(self, tenant: str) -> float:
        with self._tx() as conn:
            row = conn.execute(
                "SELECT COALESCE(SUM(time_budget_s), 0) FROM jobs "
                f"WHERE status IN ('queued', 'solving') AND {_TENANT} = %s",
                (tenant,),
            ).fetchone()
        return float(row[0]) if row else 0.0

    def heartbeat(self, *, job_id: str, owner: str, lease_s: float) -> bool:
        with self._tx() as conn:
            cur = conn.execute(
                f"UPDATE jobs SET lease_expires = {NOW} + %s WHERE id = %s AND lease_owner = %s AND status = 'solving' "
                f"AND lease_expires >= {NOW}",  # an expired lease is not renewed: it may be taken back any moment
                (lease_s, job_id, owner),
            )
            return cur.rowcount == 1

    @staticmethod
    def _owns(conn: psycopg.Connection[Any], job_id: str, owner: str) -> bool:
        """Lock the job row and check the lease, unexpired (fencing: a solver that lost its lease writes
        nothing); a concurrent recovery waits for this transaction, or wins first."""
        row = conn.execute(
            "SELECT 1 FROM jobs WHERE id = %s AND lease_owner = %s AND status = 'solving' "
            f"AND lease_expires >= {NOW} FOR UPDATE",
            (job_id, owner),
        ).fetchone()
        return row is not None

    @staticmethod
    def _insert_iterations(conn: psycopg.Connection[Any], records: Sequence[IterationRecord]) -> None:
        if not records:
            return
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO iterations ({ITERATION_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (job_id, idx) DO NOTHING",
                [
                    (r.job_id, r.index, r.doc_json, r.digest, r.wall_ms, r.status, r.bound_ms, r.pending_json)
                    for r in records
                ],
            )

    def publish_iteration(self, record: IterationRecord, *, owner: str) -> bool:
        with self._tx() as conn:
            if not self._owns(conn, record.job_id, owner):
                return False
            self._insert_iterations(conn, [record])
            conn.execute(
                "UPDATE jobs SET iterations_solved = (SELECT COUNT(*) FROM iterations WHERE job_id = %s), "
                f"updated_at = {NOW} WHERE id = %s",
                (record.job_id, record.job_id),
            )
            _notify(conn, record.job_id)
        return True

    def complete(self, *, job_id: str, owner: str, plan_json: str, iterations: Sequence[IterationRecord] = ()) -> bool:
        with self._tx() as conn:
            if not self._owns(conn, job_id, owner):
                return False
            self._insert_iterations(conn, iterations)
            row = conn.execute(
                "SELECT (SELECT COUNT(*) FROM iterations WHERE job_id = %s), num_iterations FROM jobs WHERE id = %s",
                (job_id, job_id),
            ).fetchone()
            assert row is not None
            have, total = int(row[0]), int(row[1])
            if have != total:  # a solved job serves every iteration: refuse (and roll back) a partial one
                raise ValueError(f"job {job_id}: completing with {have} of {total} iterations stored")
            conn.execute(
                "UPDATE jobs SET status = 'solved', plan = %s, error = NULL, iterations_solved = %s, "
                f"lease_owner = NULL, lease_expires = NULL, updated_at = {NOW}, finished_at = {NOW} WHERE id = %s",
                (plan_json, have, job_id),
            )
            _notify(conn, job_id)
        return True

    def fail(self, *, job_id: str, owner: str | None, error_json: str) -> bool:
        with self._tx() as conn:
            if owner is not None and not self._owns(conn, job_id, owner):
                return False
            cur = conn.execute(
                "UPDATE jobs SET status = 'failed', error = %s, lease_owner = NULL, lease_expires = NULL, "
                f"updated_at = {NOW}, finished_at = {NOW} WHERE id = %s AND status IN ('queued', 'solving')",
                (error_json, job_id),
            )
            failed = cur.rowcount == 1
            if failed:
                _notify(conn, job_id)
        return failed

    @staticmethod
    def _take_back(
        conn: psycopg.Connection[Any],
        rows: list[Any],
        *,
        reason_json: str,
        max_attempts: int,
        count_attempt: bool,
    ) -> list[Recovered]:
        out = []
        for job_id, attempts_used in take_back_decisions(rows, max_attempts=max_attempts, count_attempt=count_attempt):
            if attempts_used is not None:
                conn.execute(
                    "UPDATE jobs SET status = 'queued', attempts = %s, last_error = COALESCE(%s, last_error), "
                    f"lease_owner = NULL, lease_expires = NULL, updated_at = {NOW} WHERE id = %s",
                    (attempts_used, reason_json if count_attempt else None, job_id),
                )
                out.append(Recovered(job_id=job_id, status="queued"))
                _notify(conn, job_id, queued=True)
            else:
                conn.execute(
                    "UPDATE jobs SET status = 'failed', error = %s, lease_owner = NULL, lease_expires = NULL, "
                    f"updated_at = {NOW}, finished_at = {NOW} WHERE id = %s",
                    (reason_json, job_id),
                )
                out.append(Recovered(job_id=job_id, status="failed"))
                _notify(conn, job_id)
        return out

    def release(
        self, *, owner: str, reason_json: str, max_attempts: int, count_attempt: bool = True
    ) -> list[Recovered]:
        with self._tx() as conn:
            rows = conn.execute(
                "SELECT id, attempts FROM jobs WHERE lease_owner = %s AND status = 'solving' FOR UPDATE", (owner,)
            ).fetchall()
            return self._take_back(
                conn, rows, reason_json=reason_json, max_attempts=max_attempts, count_attempt=count_attempt
            )

    def recover_expired(self, *, reason_json: str, max_attempts: int) -> list[Recovered]:
        with self._tx() as conn:
            rows = conn.execute(
                f"SELECT id, attempts FROM jobs WHERE status = 'solving' AND lease_expires < {NOW} "
                "FOR UPDATE SKIP LOCKED"
            ).fetchall()
            return self._take_back(conn, rows, reason_json=reason_json, max_attempts=max_attempts, count_attempt=True)

    def solving_owned(self) -> list[JobRecord]:
        with self._tx() as conn:
            rows = conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE status = 'solving'").fetchall()
        return [job_from_row(r) for r in rows]

    # -- iterations ------------------------------------------------------------------------------------

    def iteration(self, job_id: str, index: int) -> IterationRecord | None:
        with self._tx() as conn:
            row = conn.execute(
                f"SELECT {ITERATION_COLUMNS} FROM iterations WHERE job_id = %s AND idx = %s", (job_id, index)
            ).fetchone()
        return None if row is None else iteration_from_row(row)

    def iterations(self, job_id: str) -> list[IterationRecord]:
        with self._tx() as conn:
            rows = conn.execute(
                f"SELECT {ITERATION_COLUMNS} FROM iterations WHERE job_id = %s ORDER BY idx", (job_id,)
            ).fetchall()
        return [iteration_from_row(r) for r in rows]

    def delete(self, job_id: str) -> bool:
        with self._tx() as conn:
            conn.execute("DELETE FROM idempotency_keys WHERE job_id = %s", (job_id,))
            found = conn.execute("DELETE FROM jobs WHERE id = %s RETURNING id", (job_id,)).fetchone() is not None
            if found:  # iterations go with the job (ON DELETE CASCADE)
                _notify(conn, job_id)
        return found

    def expire(self, *, older_than_s: float, limit: int = 1000) -> list[str]:
        with self._tx() as conn:
            rows = conn.execute(
                "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE status IN ('solved', 'failed') "
                f"AND finished_at < {NOW} - %s LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING id",
                (older_than_s, limit),
            ).fetchall()
            ids = [str(r[0]) for r in rows]
            if ids:
                conn.execute("DELETE FROM idempotency_keys WHERE job_id = ANY(%s)", (ids,))
            for job_id in ids:  # other replicas drop what they cached of the expired plans
                _notify(conn, job_id)
        return ids

    def count_by_status(self) -> dict[str, int]:
        with self._tx() as conn:
            rows = conn.execute("SELECT status, COUNT(*) FROM jobs GROUP BY status").fetchall()
        return {str(status): int(n) for status, n in rows}

    def queue_depth(self) -> int:
        with self._tx() as conn:
            row = conn.execute("SELECT COUNT(*) FROM jobs WHERE status = 'queued'").fetchone()
        return int(row[0]) if row else 0

    # -- profiles --------------------------------------------------------------------------------------

    def put_profile(self, name: str, doc_json: str, *, scope: str = "", max_profiles: int | None = None) -> bool:
        stored = scoped_profile_name(scope, name)
        with self._tx() as conn:
            row = conn.execute("SELECT doc FROM profiles WHERE name = %s", (stored,)).fetchone()
            if row is not None:
                if row[0] != doc_json:
                    raise ProfileConflictError(name)
                return False
            if max_profiles is not None:  # counted under a lock held to commit: replicas uploading at once
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (PROFILE_LOCK_KEY,))
                condition, pattern = profile_scope_sql(scope, "%s")
                held = conn.execute(f"SELECT COUNT(*) FROM profiles WHERE {condition}", (pattern,)).fetchone()
                if held is not None and int(held[0]) >= max_profiles:
                    raise ProfileQuotaError(max_profiles)
            inserted = conn.execute(
                f"INSERT INTO profiles (name, doc, created_at) VALUES (%s, %s, {NOW}) "
                "ON CONFLICT (name) DO NOTHING RETURNING name",
                (stored, doc_json),
            ).fetchone()
            if inserted is not None:
                return True
            row = conn.execute("SELECT doc FROM profiles WHERE name = %s", (stored,)).fetchone()
            if row is not None and row[0] != doc_json:
                raise ProfileConflictError(name)
        return False

    def get_profile(self, name: str, *, scope: str = "") -> str | None:
        with self._tx() as conn:
            stored = scoped_profile_name(scope, name)
            row = conn.execute("SELECT doc FROM profiles WHERE name = %s", (stored,)).fetchone()
        return None if row is None else str(row[0])

    def profile_names(self, *, scope: str | None = None) -> list[str]:
        with self._tx() as conn:
            if scope is None:
                return [str(r[0]) for r in conn.execute("SELECT name FROM profiles ORDER BY name").fetchall()]
            condition, pattern = profile_scope_sql(scope, "%s")
            rows = conn.execute(f"SELECT name FROM profiles WHERE {condition} ORDER BY name", (pattern,)).fetchall()
        return [unscoped_profile_name(scope, str(r[0])) for r in rows]

    # -- notifications ---------------------------------------------------------------------------------

    def wait_for_work(self, timeout_s: float) -> bool:
        """Wait for a NOTIFY on ``skrull_queue`` (a job became claimable), at most ``timeout_s``.

        Meant for one thread per store (a solver process's loop). Notifications that arrived while the
        caller was busy are answered at once: the caller then tries to claim, which is what they ask."""
        try:
            if self._listen_conn is None or self._listen_conn.closed:
                self._listen_conn = psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
                self._listen_conn.execute(f"LISTEN {QUEUE_CHANNEL}")
                return True  # anything queued before LISTEN is claimable now
            got = False
            for _ in self._listen_conn.notifies(timeout=max(0.0, timeout_s), stop_after=1):
                got = True
            return got
        except psycopg.Error as exc:  # the caller polls; reconnect on the next call
            log.warning("listening for queued jobs failed: %s", exc)
            if self._listen_conn is not None:
                with contextlib.suppress(Exception):
                    self._listen_conn.close()
            self._listen_conn = None
            time.sleep(min(timeout_s, 1.0))
            return False

    def watch(self, on_change: Callable[[str], None]) -> Callable[[], None]:
        """A thread listening on ``skrull_jobs`` calls ``on_change(job_id)``; reconnects after a failure."""
        stop = threading.Event()

        def run() -> None:
            while not stop.is_set():
                try:
                    with psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
                        conn.execute(f"LISTEN {JOBS_CHANNEL}")
                        while not stop.is_set():
                            for note in conn.notifies(timeout=0.5):
                                on_change(note.payload)
                except Exception as exc:
                    log.warning("watching job changes failed (long-polls fall back to re-reading): %s", exc)
                    stop.wait(1.0)

        thread = threading.Thread(target=run, name="skrull-store-watch", daemon=True)
        thread.start()

        def stop_watching() -> None:
            stop.set()
            thread.join(timeout=5)

        return stop_watching


def _redacted(url: str) -> str:
    """The URL without its password (for error messages)."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error:
        return "<unparsable URL>"
    info.pop("password", None)
    return " ".join(f"{k}={v}" for k, v in info.items())

"""The embedded job store: one SQLite file in WAL mode, shared by the server and its solver processes.

WAL lets readers (the HTTP server answering polls) run while a solver process writes. Every write is
one short ``BEGIN IMMEDIATE`` transaction, so writers queue on SQLite's lock (``busy_timeout``) instead
of failing. ``synchronous=NORMAL`` in WAL mode keeps every committed transaction across a crash of any
process; ``FULL`` adds an fsync per commit so a power loss loses nothing either.

Connections are per thread (SQLite connections must not be shared between threads) and per process
(a solver process opens its own store on the same file).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Unpack

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
    profile_scope_sql,
    scoped_profile_name,
    take_back_decisions,
    tenant_sql,
    unscoped_profile_name,
)
from skrull.api.store.migrations import Migration, check_ordered, pending
from skrull.api.store.rows import JOB_COLUMNS, iteration_from_row, job_from_row

_SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    status TEXT NOT NULL,
    solver TEXT NOT NULL,
    request TEXT NOT NULL,
    num_iterations INTEGER NOT NULL,
    iterations_solved INTEGER NOT NULL DEFAULT 0,
    num_sequences INTEGER NOT NULL,
    num_gpus INTEGER NOT NULL,
    time_budget_s REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    plan TEXT,
    error TEXT,
    last_error TEXT,
    lease_owner TEXT,
    lease_expires REAL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL
);
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (status, seq);
CREATE TABLE IF NOT EXISTS iterations (
    job_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    doc TEXT NOT NULL,
    digest TEXT NOT NULL,
    wall_ms REAL NOT NULL,
    status TEXT NOT NULL,
    bound_ms REAL,
    pending TEXT NOT NULL,
    PRIMARY KEY (job_id, idx)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key TEXT PRIMARY KEY,
    job_id TEXT NOT NULL,
    created_at REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS profiles (
    name TEXT PRIMARY KEY,
    doc TEXT NOT NULL,
    created_at REAL NOT NULL
) WITHOUT ROWID;
"""

#: Ordered schema steps (``api.store.migrations``); append, never edit a released step.
MIGRATIONS = (
    Migration(
        version=1,
        description="jobs, iterations, idempotency keys, profiles",
        statements=tuple(s.strip() for s in _SCHEMA_V1.split(";") if s.strip()),
    ),
    Migration(
        version=2,
        description="when each tenant's job was last claimed (fair claims)",
        statements=(
            "CREATE TABLE IF NOT EXISTS tenant_claims (tenant TEXT PRIMARY KEY, claimed_at REAL NOT NULL) "
            "WITHOUT ROWID",
        ),
    ),
    Migration(
        version=3,
        description="each Idempotency-Key's tenant (bounded per tenant)",
        statements=(
            "ALTER TABLE idempotency_keys ADD COLUMN tenant TEXT NOT NULL DEFAULT ''",
            "UPDATE idempotency_keys SET tenant = substr(key, 1, 8) WHERE substr(key, 9, 1) = ':' "
            "AND substr(key, 1, 8) NOT GLOB '*[^0-9a-f]*'",
            "CREATE INDEX IF NOT EXISTS idempotency_keys_by_tenant ON idempotency_keys (tenant, created_at)",
        ),
    ),
)
_TENANT = tenant_sql("id", find="instr")
#: The next job: the tenant with the fewest solving, then the one served least recently, then the oldest.
_FAIR_NEXT = fair_next_sql(find="instr")
_FAIR_NEXT_SHORT = fair_next_sql(find="instr", max_budget="?")
SCHEMA_VERSION = check_ordered(MIGRATIONS)


class SQLiteJobStore:
    """``JobStore`` on one SQLite file (see ``api.store.base`` for the semantics)."""

    def __init__(self, path: str | Path, *, synchronous: str = "NORMAL", busy_timeout_ms: int = 30_000) -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous: {synchronous!r}: must be NORMAL or FULL")
        self.path = Path(path)
        self._synchronous = synchronous
        self._busy_timeout_ms = busy_timeout_ms
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = self._conn()
        with self._write(conn):
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_version "
                "(version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
            current = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()[0]
            for step in pending(MIGRATIONS, current=int(current)):
                for statement in step.statements:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO schema_version (version, description, applied_at) VALUES (?, ?, ?)",
                    (step.version, step.description, time.time()),
                )
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    #: SQLite has no server to push changes: idle solver processes are woken by their own server
    #: (``api.solvers.pool``) or poll, and long-polls re-read the file.
    notifies = False

    def wait_for_work(self, timeout_s: float) -> bool:
        """Nothing pushes work to a file: sleep ``timeout_s`` (the caller polls)."""
        time.sleep(max(0.0, timeout_s))
        return False

    def watch(self, on_change: Callable[[str], None]) -> Callable[[], None]:
        """Nothing to watch on a file; the returned stop function does nothing."""
        return lambda: None

    # -- connections and transactions ------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn

    @contextmanager
    def _write(self, conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            for conn in self._connections:
                conn.close()
            self._connections.clear()
        self._local = threading.local()

    # -- jobs ------------------------------------------------------------------------------------------

    def submit(self, job: NewJob, **limits: Unpack[SubmitLimits]) -> SubmitOutcome:
        idempotency_key, max_queued, quota = (
            limits.get("idempotency_key"),
            limits.get("max_queued"),
            limits.get("quota"),
        )
        conn = self._conn()
        now = time.time()
        created = requeued = False
        with self._write(conn):
            if idempotency_key is not None:
                row = conn.execute("SELECT job_id FROM idempotency_keys WHERE key = ?", (idempotency_key,)).fetchone()
                if row is not None and row[0] != job.job_id:
                    raise IdempotencyConflictError(idempotency_key, row[0])
                if row is None:
                    tenant = quota.tenant if quota is not None else ""
                    conn.execute(
                        "INSERT INTO idempotency_keys (key, job_id, created_at, tenant) VALUES (?, ?, ?, ?)",
                        (idempotency_key, job.job_id, now, tenant),
                    )
                    if quota is not None and quota.max_idempotency_keys is not None:
                        conn.execute(  # the tenant's newest keys are kept; older ones are forgotten
                            "DELETE FROM idempotency_keys WHERE key IN (SELECT key FROM idempotency_keys "
                            "WHERE tenant = ? ORDER BY created_at DESC, key LIMIT -1 OFFSET ?)",
                            (tenant, quota.max_idempotency_keys),
                        )
            row = conn.execute("SELECT status FROM jobs WHERE id = ?", (job.job_id,)).fetchone()
            if max_queued is not None and (row is None or row[0] == "failed"):
                # Under BEGIN IMMEDIATE: no other writer (in any process) can queue a job between count and insert.
                (queued,) = conn.execute("SELECT COUNT(*) FROM jobs WHERE status = 'queued'").fetchone()
                if queued >= max_queued:
                    raise QueueFullError(max_queued)
            if quota is not None and (row is None or row[0] == "failed"):
                held = conn.execute(
                    "SELECT COALESCE(SUM(status = 'queued'), 0), COALESCE(SUM(time_budget_s), 0) FROM jobs "
                    f"WHERE status IN ('queued', 'solving') AND {_TENANT} = ?",
                    (quota.tenant,),
                ).fetchone()
                check_quota(quota, queued=int(held[0]), solver_s=float(held[1]), adding_s=job.time_budget_s)
            if row is None:
                conn.execute(
                    "INSERT INTO jobs (id, status, solver, request, num_iterations, num_sequences, num_gpus, "
                    "time_budget_s, created_at, updated_at) VALUES (?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        job.job_id,
                        job.solver,
                        job.request_json,
                        job.num_iterations,
                        job.num_sequences,
                        job.num_gpus,
                        job.time_budget_s,
                        now,
                        now,
                    ),
                )
                created = True
            elif row[0] == "failed":
                # A resubmitted failure is a fresh try; iterations published before the failure stay valid.
                conn.execute(
                    "UPDATE jobs SET status = 'queued', attempts = 0, last_error = error, error = NULL, "
                    "finished_at = NULL, updated_at = ? WHERE id = ?",
                    (now, job.job_id),
                )
                requeued = True
            record = conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?", (job.job_id,)).fetchone()
        return SubmitOutcome(job=job_from_row(record), created=created, requeued=requeued)

    def get(self, job_id: str) -> JobRecord | None:
        row = self._conn().execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else job_from_row(row)

    def request_json(self, job_id: str) -> str | None:
        row = self._conn().execute("SELECT request FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else str(row[0])

    def claim(self, *, owner: str, lease_s: float, max_budget_s: float | None = None) -> ClaimedJob | None:
        conn = self._conn()
        # Idle solver processes poll: look before taking the write lock.
        if conn.execute("SELECT 1 FROM jobs WHERE status = 'queued' LIMIT 1").fetchone() is None:
            return None
        now = time.time()
        with self._write(conn):
            if max_budget_s is None:
                nxt = conn.execute(_FAIR_NEXT).fetchone()
            else:
                nxt = conn.execute(_FAIR_NEXT_SHORT, (max_budget_s,)).fetchone()
            if nxt is None:
                return None
            row = conn.execute(
                "UPDATE jobs SET status = 'solving', lease_owner = ?, lease_expires = ?, attempts = attempts + 1, "
                "started_at = ?, updated_at = ? WHERE seq = ? "
                "RETURNING id, solver, request, attempts, lease_expires",
                (owner, now + lease_s, now, now, nxt[0]),
            ).fetchone()
            conn.execute(
                "INSERT INTO tenant_claims (tenant, claimed_at) VALUES (?, ?) "
                "ON CONFLICT (tenant) DO UPDATE SET claimed_at = excluded.claimed_at",
                (nxt[1], now),
            )
        if row is None:
            return None
        return ClaimedJob(job_id=row[0], solver=row[1], request_json=row[2], attempts=row[3], lease_expires=row[4])

    def tenant_solver_s(self, tenant: str) -> float:
        row = (
            self._conn()
            .execute(
                "SELECT COALESCE(SUM(time_budget_s), 0) FROM jobs "
                f"WHERE status IN ('queued', 'solving') AND {_TENANT} = ?",
                (tenant,),
            )
            .fetchone()
        )
        return float(row[0])

    def heartbeat(self, *, job_id: str, owner: str, lease_s: float) -> bool:
        conn = self._conn()
        now = time.time()
        with self._write(conn):
            cur = conn.execute(
                "UPDATE jobs SET lease_expires = ? WHERE id = ? AND lease_owner = ? AND status = 'solving' "
                "AND lease_expires >= ?",  # an expired lease is not renewed: it may be taken back any moment
                (now + lease_s, job_id, owner, now),
            )
        return cur.rowcount == 1

    def _owns(self, conn: sqlite3.Connection, job_id: str, owner: str) -> bool:
        """The lease is this owner's and unexpired (fencing: a solver that lost its lease writes nothing)."""
        row = conn.execute(
            "SELECT 1 FROM jobs WHERE id = ? AND lease_owner = ? AND status = 'solving' AND lease_expires >= ?",
            (job_id, owner, time.time()),
        ).fetchone()
        return row is not None

    def _insert_iterations(self, conn: sqlite3.Connection, records: Sequence[IterationRecord]) -> None:
        conn.executemany(
            "INSERT OR IGNORE INTO iterations (job_id, idx, doc, digest, wall_ms, status, bound_ms, pending) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (r.job_id, r.index, r.doc_json, r.digest, r.wall_ms, r.status, r.bound_ms, r.pending_json)
                for r in records
            ],
        )

    def publish_iteration(self, record: IterationRecord, *, owner: str) -> bool:
        conn = self._conn()
        now = time.time()
        with self._write(conn):
            if not self._owns(conn, record.job_id, owner):
                return False
            self._insert_iterations(conn, [record])
            conn.execute(
                "UPDATE jobs SET iterations_solved = (SELECT COUNT(*) FROM iterations WHERE job_id = ?), "
                "updated_at = ? WHERE id = ?",
                (record.job_id, now, record.job_id),
            )
        return True

    def complete(self, *, job_id: str, owner: str, plan_json: str, iterations: Sequence[IterationRecord] = ()) -> bool:
        conn = self._conn()
        now = time.time()
        with self._write(conn):
            if not self._owns(conn, job_id, owner):
                return False
            self._insert_iterations(conn, iterations)
            have, total = conn.execute(
                "SELECT (SELECT COUNT(*) FROM iterations WHERE job_id = ?), num_iterations FROM jobs WHERE id = ?",
                (job_id, job_id),
            ).fetchone()
            if have != total:  # a solved job serves every iteration: refuse (and roll back) a partial one
                raise ValueError(f"job {job_id}: completing with {have} of {total} iterations stored")
            conn.execute(
                "UPDATE jobs SET status = 'solved', plan = ?, error = NULL, iterations_solved = ?, "
                "lease_owner = NULL, lease_expires = NULL, updated_at = ?, finished_at = ? WHERE id = ?",
                (plan_json, have, now, now, job_id),
            )
        return True

    def fail(self, *, job_id: str, owner: str | None, error_json: str) -> bool:
        conn = self._conn()
        now = time.time()
        with self._write(conn):
            if owner is not None and not self._owns(conn, job_id, owner):
                return False
            cur = conn.execute(
                "UPDATE jobs SET status = 'failed', error = ?, lease_owner = NULL, lease_expires = NULL, "
                "updated_at = ?, finished_at = ? WHERE id = ? AND status IN ('queued', 'solving')",
                (error_json, now, now, job_id),
            )
        return cur.rowcount == 1

    def _take_back(
        self, conn: sqlite3.Connection, rows: list[Any], *, reason_json: str, max_attempts: int, count_attempt: bool
    ) -> list[Recovered]:
        now = time.time()
        out = []
        for job_id, attempts_used in take_back_decisions(rows, max_attempts=max_attempts, count_attempt=count_attempt):
            if attempts_used is not None:
                conn.execute(
                    "UPDATE jobs SET status = 'queued', attempts = ?, last_error = COALESCE(?, last_error), "
                    "lease_owner = NULL, lease_expires = NULL, updated_at = ? WHERE id = ?",
                    (attempts_used, reason_json if count_attempt else None, now, job_id),
                )
                out.append(Recovered(job_id=job_id, status="queued"))
            else:
                conn.execute(
                    "UPDATE jobs SET status = 'failed', error = ?, lease_owner = NULL, lease_expires = NULL, "
                    "updated_at = ?, finished_at = ? WHERE id = ?",
                    (reason_json, now, now, job_id),
                )
                out.append(Recovered(job_id=job_id, status="failed"))
        return out

    def release(
        self, *, owner: str, reason_json: str, max_attempts: int, count_attempt: bool = True
    ) -> list[Recovered]:
        conn = self._conn()
        with self._write(conn):
            rows = conn.execute(
                "SELECT id, attempts FROM jobs WHERE lease_owner = ? AND status = 'solving'", (owner,)
            ).fetchall()
            return self._take_back(
                conn, rows, reason_json=reason_json, max_attempts=max_attempts, count_attempt=count_attempt
            )

    def recover_expired(self, *, reason_json: str, max_attempts: int) -> list[Recovered]:
        conn = self._conn()
        with self._write(conn):
            rows = conn.execute(
                "SELECT id, attempts FROM jobs WHERE status = 'solving' AND lease_expires < ?", (time.time(),)
            ).fetchall()
            return self._take_back(conn, rows, reason_json=reason_json, max_attempts=max_attempts, count_attempt=True)

    def solving_owned(self) -> list[JobRecord]:
        rows = self._conn().execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE status = 'solving'").fetchall()
        return [job_from_row(r) for r in rows]

    # -- iterations ------------------------------------------------------------------------------------

    def iteration(self, job_id: str, index: int) -> IterationRecord | None:
        row = (
            self._conn()
            .execute(
                "SELECT job_id, idx, doc, digest, wall_ms, status, bound_ms, pending FROM iterations "
                "WHERE job_id = ? AND idx = ?",
                (job_id, index),
            )
            .fetchone()
        )
        return None if row is None else iteration_from_row(row)

    def iterations(self, job_id: str) -> list[IterationRecord]:
        rows = (
            self._conn()
            .execute(
                "SELECT job_id, idx, doc, digest, wall_ms, status, bound_ms, pending FROM iterations "
                "WHERE job_id = ? ORDER BY idx",
                (job_id,),
            )
            .fetchall()
        )
        return [iteration_from_row(r) for r in rows]

    def _delete(self, conn: sqlite3.Connection, job_ids: Sequence[str]) -> None:
        rows = [(j,) for j in job_ids]
        conn.executemany("DELETE FROM iterations WHERE job_id = ?", rows)
        conn.executemany("DELETE FROM idempotency_keys WHERE job_id = ?", rows)
        conn.executemany("DELETE FROM jobs WHERE id = ?", rows)

    def delete(self, job_id: str) -> bool:
        conn = self._conn()
        with self._write(conn):
            found = conn.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is not None
            self._delete(conn, [job_id])
        return found

    def expire(self, *, older_than_s: float, limit: int = 1000) -> list[str]:
        conn = self._conn()
        with self._write(conn):
            ids = [
                str(r[0])
                for r in conn.execute(
                    "SELECT id FROM jobs WHERE status IN ('solved', 'failed') AND finished_at < ? LIMIT ?",
                    (time.time() - older_than_s, limit),
                ).fetchall()
            ]
            self._delete(conn, ids)
        return ids

    def count_by_status(self) -> dict[str, int]:
        rows = self._conn().execute("SELECT status, COUNT(*) FROM jobs GROUP BY status").fetchall()
        return {str(status): int(n) for status, n in rows}

    def queue_depth(self) -> int:
        row = self._conn().execute("SELECT COUNT(*) FROM jobs WHERE status = 'queued'").fetchone()
        return int(row[0])

    # -- profiles --------------------------------------------------------------------------------------

    def put_profile(self, name: str, doc_json: str, *, scope: str = "", max_profiles: int | None = None) -> bool:
        conn = self._conn()
        stored = scoped_profile_name(scope, name)
        with self._write(conn):
            row = conn.execute("SELECT doc FROM profiles WHERE name = ?", (stored,)).fetchone()
            if row is not None:
                if row[0] != doc_json:
                    raise ProfileConflictError(name)
                return False
            if max_profiles is not None:  # under BEGIN IMMEDIATE: no upload can land between count and insert
                condition, pattern = profile_scope_sql(scope, "?")
                (held,) = conn.execute(f"SELECT COUNT(*) FROM profiles WHERE {condition}", (pattern,)).fetchone()
                if held >= max_profiles:
                    raise ProfileQuotaError(max_profiles)
            conn.execute(
                "INSERT INTO profiles (name, doc, created_at) VALUES (?, ?, ?)", (stored, doc_json, time.time())
            )
        return True

    def get_profile(self, name: str, *, scope: str = "") -> str | None:
        row = (
            self._conn()
            .execute("SELECT doc FROM profiles WHERE name = ?", (scoped_profile_name(scope, name),))
            .fetchone()
        )
        return None if row is None else str(row[0])

    def profile_names(self, *, scope: str | None = None) -> list[str]:
        if scope is None:
            return [str(r[0]) for r in self._conn().execute("SELECT name FROM profiles ORDER BY name").fetchall()]
        condition, pattern = profile_scope_sql(scope, "?")
        rows = self._conn().execute(f"SELECT name FROM profiles WHERE {condition} ORDER BY name", (pattern,))
        return [unscoped_profile_name(scope, str(r[0])) for r in rows.fetchall()]

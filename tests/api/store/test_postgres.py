"""What only the PostgreSQL backend does: migrations under a lock, SKIP LOCKED claims from many
processes, LISTEN/NOTIFY wake-ups, and clear errors for an unreachable server."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time

import psycopg
import pytest

from skrull.api.store.base import NewJob
from skrull.api.store.migrations import SchemaTooNewError
from skrull.api.store.postgres import JOBS_CHANNEL, SCHEMA_VERSION, PostgresJobStore
from tests.api.pg import temporary_database


def job(n: int) -> NewJob:
    return NewJob(
        job_id=f"job{n:04d}",
        request_json=json.dumps({"n": n}),
        solver="skrull",
        num_iterations=1,
        num_sequences=1,
        num_gpus=1,
        time_budget_s=1.0,
    )


def test_replicas_starting_together_migrate_the_schema_once() -> None:
    with temporary_database() as url:
        stores: list[PostgresJobStore] = []
        threads = [threading.Thread(target=lambda: stores.append(PostgresJobStore(url))) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(stores) == 4 and all(s.schema_version() == SCHEMA_VERSION for s in stores)
        with psycopg.connect(url) as conn:
            rows = conn.execute("SELECT version FROM schema_version ORDER BY version").fetchall()
        assert [v for (v,) in rows] == list(range(1, SCHEMA_VERSION + 1))
        for s in stores:
            s.close()


def test_refuses_a_database_migrated_by_a_newer_release() -> None:
    with temporary_database() as url:
        PostgresJobStore(url).close()
        with psycopg.connect(url) as conn:
            conn.execute(
                "INSERT INTO schema_version (version, description) VALUES (%s, 'future')", (SCHEMA_VERSION + 1,)
            )
        with pytest.raises(SchemaTooNewError):
            PostgresJobStore(url)


def test_an_unreachable_server_is_one_clear_error_without_the_password() -> None:
    with pytest.raises(ConnectionError, match="cannot reach PostgreSQL") as info:
        PostgresJobStore("postgresql://skrull:s3cret@127.0.0.1:1/none", connect_timeout_s=1)
    assert "s3cret" not in str(info.value)


def _claim_all(url: str, owner: str, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    store = PostgresJobStore(url, pool_size=1)
    got = []
    while (c := store.claim(owner=owner, lease_s=30)) is not None:
        got.append(c.job_id)
    store.close()
    out.put(got)


def test_claims_from_four_processes_hand_every_job_out_exactly_once() -> None:
    with temporary_database() as url:
        store = PostgresJobStore(url)
        for n in range(200):
            store.submit(job(n))
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        procs = [ctx.Process(target=_claim_all, args=(url, f"p{k}", out)) for k in range(4)]
        for p in procs:
            p.start()
        claimed = [j for _ in procs for j in out.get(timeout=60)]
        for p in procs:
            p.join()
        assert sorted(claimed) == [f"job{n:04d}" for n in range(200)]
        assert store.count_by_status() == {"solving": 200}
        store.close()


def test_an_idle_worker_is_woken_by_a_submission_from_another_connection() -> None:
    with temporary_database() as url:
        worker, api = PostgresJobStore(url), PostgresJobStore(url)
        assert worker.wait_for_work(0.0)  # the first call starts listening: look at the queue now
        assert not worker.wait_for_work(0.2)  # nothing queued: it waits the whole timeout
        threading.Timer(0.3, lambda: api.submit(job(1))).start()
        start = time.monotonic()
        assert worker.wait_for_work(60.0)
        assert time.monotonic() - start < 30.0  # woken, not timed out at 60 s
        assert worker.claim(owner="w", lease_s=10) is not None
        worker.close()
        api.close()


def test_watchers_hear_every_change_to_a_job() -> None:
    with temporary_database() as url:
        store = PostgresJobStore(url)
        heard: list[str] = []
        stop = store.watch(heard.append)
        # The watcher connects and LISTENs in its own thread: notify a sentinel until it is heard, so the
        # changes below are made only once it listens, however long connecting takes on a loaded machine.
        deadline = time.monotonic() + 120
        with psycopg.connect(url, autocommit=True) as conn:
            while "sentinel" not in heard and time.monotonic() < deadline:
                conn.execute("SELECT pg_notify(%s, 'sentinel')", (JOBS_CHANNEL,))
                time.sleep(0.1)
        assert "sentinel" in heard, "the watcher never started listening"
        store.submit(job(1))
        claimed = store.claim(owner="w", lease_s=10)
        assert claimed is not None
        store.fail(job_id="job0001", owner="w", error_json="{}")

        def changes() -> list[str]:
            return [h for h in heard if h != "sentinel"]  # late echoes of the sentinel may still arrive

        deadline = time.monotonic() + 60
        while len(changes()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        stop()
        assert changes()[:3] == ["job0001"] * 3
        store.close()


def test_lease_times_come_from_the_database_clock() -> None:
    with temporary_database() as url:
        store = PostgresJobStore(url)
        store.submit(job(1))
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        assert row is not None
        claimed = store.claim(owner="w", lease_s=60)
        assert claimed is not None and abs(claimed.lease_expires - (row[0] + 60)) < 5
        store.close()


def test_a_server_that_answers_but_refuses_says_why() -> None:
    with pytest.raises(ConnectionError, match=r'refused the connection: FATAL: +role "no_such_role" does not exist'):
        PostgresJobStore("postgresql://no_such_role@127.0.0.1:5432/test", connect_timeout_s=2)

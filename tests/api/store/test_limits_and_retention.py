"""The queue bound, deletion and expiry on every backend (a real SQLite file, a real PostgreSQL database),
and what a damaged SQLite file answers."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from skrull.api.store.base import JobStore, QueueFullError
from skrull.api.store.open import StoreUnusableError, open_store
from tests.api.store.conftest import Backend
from tests.api.store.test_base import job, record


def fail_one(store: JobStore, n: int) -> str:
    """Submit job ``n``, claim it and fail it; its id."""
    j = job(n)
    store.submit(j)
    claimed = store.claim(owner="w", lease_s=30)
    assert claimed is not None and claimed.job_id == j.job_id
    assert store.fail(job_id=j.job_id, owner="w", error_json='{"detail": "boom"}')
    return j.job_id


def test_the_queue_bound_holds_for_new_and_requeued_jobs(store: JobStore) -> None:
    failed = [fail_one(store, n) for n in range(10)]
    for n in range(100, 103):
        store.submit(job(n), max_queued=3)
    with pytest.raises(QueueFullError):
        store.submit(job(200), max_queued=3)
    for n in range(10):  # resubmitting failed requests would queue them again: refused too
        with pytest.raises(QueueFullError):
            store.submit(job(n), max_queued=3)
    assert store.queue_depth() == 3
    assert all(store.get(j).status == "failed" for j in failed)  # type: ignore[union-attr]
    # a duplicate of a queued job is answered, not refused: it adds nothing to the queue
    assert not store.submit(job(100), max_queued=3).created


def test_two_replicas_never_exceed_the_bound_under_concurrent_submits(backend: Backend) -> None:
    replicas = [backend.open(), backend.open()]
    accepted: list[str] = []
    refused: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(20)

    def submitter(k: int) -> None:
        store = replicas[k % 2]
        start.wait()
        for n in range(k * 10, k * 10 + 10):
            try:
                outcome = store.submit(job(n), max_queued=10)
            except QueueFullError:
                with lock:
                    refused.append(n)
            else:
                with lock:
                    accepted.append(outcome.job.job_id)

    threads = [threading.Thread(target=submitter, args=(k,)) for k in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(accepted) == 10 and len(refused) == 190
    assert replicas[0].queue_depth() == 10


def test_delete_removes_the_job_its_iterations_and_its_keys(store: JobStore) -> None:
    j = job(1, iterations=2)
    store.submit(j, idempotency_key="k1")
    claimed = store.claim(owner="w", lease_s=30)
    assert claimed is not None
    assert store.publish_iteration(record(j.job_id, 0), owner="w")
    assert store.delete(j.job_id)
    assert store.get(j.job_id) is None and store.iterations(j.job_id) == []
    # the solver that held it loses it, and its results are refused
    assert not store.publish_iteration(record(j.job_id, 1), owner="w")
    assert not store.delete(j.job_id)
    # the key is free again, and the same request is planned afresh under the same id
    outcome = store.submit(j, idempotency_key="k1")
    assert outcome.created and outcome.job.status == "queued" and outcome.job.iterations_solved == 0


def test_expire_deletes_only_finished_jobs_older_than_the_retention(store: JobStore) -> None:
    # A retention of seconds: the new job, finished just before the first expire, stays younger than it
    # however slowly a loaded machine gets there; the sleeps outlast it.
    retention_s = 2.0
    old_failed = fail_one(store, 1)
    time.sleep(retention_s + 0.5)
    new_failed = fail_one(store, 3)
    queued = store.submit(job(2)).job.job_id
    assert store.expire(older_than_s=retention_s) == [old_failed]
    assert store.get(old_failed) is None
    assert store.get(queued) is not None and store.get(new_failed) is not None
    time.sleep(retention_s + 0.5)
    assert store.expire(older_than_s=retention_s) == [new_failed]
    assert store.get(queued) is not None  # never expired before it finished


def test_a_file_that_is_not_a_database_is_one_error_naming_it_and_the_recovery(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    path.write_bytes(b"this is not a SQLite file" * 200)
    with pytest.raises(StoreUnusableError) as err:
        open_store(str(path))
    text = str(err.value)
    assert str(path) in text and "damaged" in text and ".recover" in text and "\n" not in text


def damage_pages(path: Path, *, keep_pages: int) -> None:
    """Overwrite every page of a SQLite file after the first ``keep_pages`` (schema) with garbage."""
    data = bytearray(path.read_bytes())
    page_size = int.from_bytes(data[16:18], "big")
    for offset in range(keep_pages * page_size, len(data), page_size):
        data[offset : offset + page_size] = bytes([0x5A]) * page_size
    path.write_bytes(bytes(data))


def test_damaged_pages_are_named_not_internal_errors(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from skrull.api.app import create_app
    from skrull.api.settings import Settings

    path = tmp_path / "jobs.db"
    store = open_store(str(path))
    ids = [store.submit(job(n)).job.job_id for n in range(200)]
    store.close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    (schema_pages,) = conn.execute("SELECT MAX(rootpage) FROM sqlite_master").fetchone()
    conn.close()
    damage_pages(path, keep_pages=int(schema_pages) + 1)
    with TestClient(create_app(Settings(db=path, solver_processes=0))) as client:
        answers = [client.get(f"/v1/plans/{i}") for i in ids]
    statuses = {r.status_code for r in answers}
    assert 500 not in statuses and 410 in statuses, statuses
    damaged = next(r for r in answers if r.status_code == 410)
    problem = damaged.json()
    assert problem["type"] == "urn:skrull:problem:plan-damaged" and problem["plan_id"] in ids
    assert problem["plan_id"] in problem["detail"]


def test_a_stored_row_that_is_not_json_is_named_when_served(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from skrull.api.app import create_app
    from skrull.api.settings import Settings

    path = tmp_path / "jobs.db"
    store = open_store(str(path))
    j = job(1)
    store.submit(j)
    assert store.claim(owner="w", lease_s=30) is not None
    assert store.complete(job_id=j.job_id, owner="w", plan_json="{}", iterations=[record(j.job_id, 0)])
    store.close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE iterations SET doc = '{not json' WHERE job_id = ?", (j.job_id,))
    with TestClient(create_app(Settings(db=path, solver_processes=0))) as client:
        r = client.get(f"/v1/plans/{j.job_id}/ranks/0?iteration=0")
    assert r.status_code == 410, r.text
    assert json.loads(r.text)["plan_id"] == j.job_id

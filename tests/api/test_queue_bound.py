"""The queue bound through the service: resubmitting failed requests cannot push the queue past
``SKRULL_MAX_QUEUED_JOBS`` (the issue's case: bound 3, queue full, 10 failed requests resubmitted)."""

from __future__ import annotations

from pathlib import Path

from tests.api.conftest import plan_request, running_app


def test_resubmitted_failures_are_refused_when_the_queue_is_full(tmp_path: Path) -> None:
    db = tmp_path / "jobs.db"
    failing = [plan_request([[10 + k]], solver="test-infeasible") for k in range(10)]
    with running_app(db) as client:
        ids = [client.post("/v1/plans", json=doc).json()["id"] for doc in failing]
        for plan_id in ids:
            assert client.get(f"/v1/plans/{plan_id}?wait=30&until=final").json()["status"] == "failed"
    with running_app(db, solver_processes=0, max_queued_jobs=3) as client:
        for k in range(3):
            assert client.post("/v1/plans", json=plan_request([[50 + k]])).status_code == 202
        for doc in failing:
            r = client.post("/v1/plans", json=doc)
            assert r.status_code == 503, r.text
            assert r.json()["type"] == "urn:skrull:problem:queue-full" and r.json()["limit"] == 3
            assert r.headers["Retry-After"]
        assert client.get("/healthz").json()["jobs"]["queued"] == 3
        # a duplicate of a queued request is answered: it adds nothing
        again = client.post("/v1/plans", json=plan_request([[50]]))
        assert again.status_code == 202 and again.headers["Idempotent-Replayed"] == "true"

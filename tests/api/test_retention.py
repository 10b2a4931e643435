"""``DELETE /v1/plans/{id}`` (a submit token) and the expiry sweep, through the service."""

from __future__ import annotations

import time
from pathlib import Path

from tests.api.conftest import plan_request, running_app


def test_delete_needs_a_submit_token_and_removes_the_plan(tmp_path: Path) -> None:
    with running_app(tmp_path / "jobs.db", submit_tokens="s3cret", read_tokens="reader") as client:
        write = {"Authorization": "Bearer s3cret"}
        read = {"Authorization": "Bearer reader"}
        plan_id = client.post("/v1/plans", json=plan_request([[50, 60]]), headers=write).json()["id"]
        solved = client.get(f"/v1/plans/{plan_id}?wait=30&until=final", headers=read).json()
        assert solved["status"] == "solved"
        assert client.get(f"/v1/plans/{plan_id}/ranks/0?iteration=0", headers=read).status_code == 200
        assert client.delete(f"/v1/plans/{plan_id}").status_code == 401
        assert client.delete(f"/v1/plans/{plan_id}", headers=read).status_code == 403
        assert client.delete(f"/v1/plans/{plan_id}", headers=write).status_code == 204
        assert client.get(f"/v1/plans/{plan_id}", headers=read).status_code == 404
        # the cached view went with it
        assert client.get(f"/v1/plans/{plan_id}/ranks/0?iteration=0", headers=read).status_code == 404
        r = client.delete(f"/v1/plans/{plan_id}", headers=write)
        assert r.status_code == 404 and r.json()["field"] == "plan_id"
        # the same request is planned afresh under the same id
        again = client.post("/v1/plans", json=plan_request([[50, 60]]), headers=write)
        assert again.status_code == 202 and again.json()["id"] == plan_id and "Idempotent-Replayed" not in again.headers


def test_finished_plans_expire_after_the_retention(tmp_path: Path) -> None:
    with running_app(tmp_path / "jobs.db", plan_retention_s=0.5, retention_sweep_s=0.2) as client:
        plan_id = client.post("/v1/plans", json=plan_request([[70, 80]])).json()["id"]
        assert client.get(f"/v1/plans/{plan_id}?wait=30&until=final").json()["status"] == "solved"
        deadline = time.monotonic() + 10
        while client.get(f"/v1/plans/{plan_id}").status_code == 200:
            assert time.monotonic() < deadline, "the plan was not expired"
            time.sleep(0.1)
        assert 'skrull_plans_deleted_total{reason="expired"} 1' in client.get("/metrics").text

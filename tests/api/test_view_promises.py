"""What a rank view promises across failures and resubmissions, against real servers: a failed plan's
views answer 409 with the failure, also for iterations published before it failed and already cached;
after DELETE and a resubmission under the same id, no replica serves the old plan's views."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.api.conftest import LiveServer, plan_request


def _final(client: httpx.Client, plan_id: str, timeout_s: float = 120.0) -> str:
    """The plan's final status: long-polls shorter than the client's timeout, until one answers final."""
    deadline = time.monotonic() + timeout_s
    while True:
        status: str = client.get(f"/v1/plans/{plan_id}", params={"wait": 10, "until": "final"}).json()["status"]
        if status in ("solved", "failed") or time.monotonic() > deadline:
            return status


def test_a_failed_plans_views_answer_409_even_where_an_iteration_was_published(
    live_server_factory: Callable[..., LiveServer], store_location: str, tmp_path: Path
) -> None:
    # test-fails-later refuses the second batch only once this test has seen the first: fail_gate
    fail_gate = tmp_path / "fail"
    env = {"SKRULL_TEST_FAIL_GATE": str(fail_gate), "SKRULL_TEST_MARKER_DIR": str(tmp_path)}
    server = live_server_factory(store_location, solver_processes=1, env=env).start()
    with httpx.Client(base_url=server.url, timeout=30) as client:
        # a budget whose hard limit (3 x 30 s + grace) no wait for the gate reaches
        doc = plan_request([[10, 20, 30], [13, 20]], dp=1, cp=2, solver="test-fails-later", time_budget_s=30)
        plan_id = client.post("/v1/plans", json=doc).json()["id"]
        first = client.get(f"/v1/plans/{plan_id}/ranks/0", params={"iteration": 0, "wait": 20})
        assert first.status_code == 200  # published (and cached) while the second batch is still solving
        fail_gate.touch()
        assert _final(client, plan_id) == "failed"
        for iteration in (0, 1):
            r = client.get(f"/v1/plans/{plan_id}/ranks/0", params={"iteration": iteration})
            assert r.status_code == 409, r.text
            problem = r.json()
            assert problem["type"] == "urn:skrull:problem:plan-failed"
            assert "13 tokens" in problem["detail"]


def test_delete_and_resubmit_never_serve_the_old_views_from_any_replica(
    live_server_factory: Callable[..., LiveServer], pg_db: str, tmp_path: Path
) -> None:
    env = {"SKRULL_TEST_MARKER_DIR": str(tmp_path)}
    a = live_server_factory(pg_db, solver_processes=1, env=env).start()
    b = live_server_factory(pg_db, solver_processes=0, env=env).start()
    doc = plan_request([[10, 20, 30, 40]], dp=1, cp=2, solver="test-flip")
    with httpx.Client(base_url=a.url, timeout=30) as ca, httpx.Client(base_url=b.url, timeout=30) as cb:
        plan_id = ca.post("/v1/plans", json=doc).json()["id"]
        assert _final(ca, plan_id) == "solved"
        old = cb.get(f"/v1/plans/{plan_id}/ranks/0", params={"iteration": 0}).json()  # cached on replica b
        assert ca.delete(f"/v1/plans/{plan_id}").status_code == 204
        assert ca.post("/v1/plans", json=doc).json()["id"] == plan_id
        assert _final(ca, plan_id) == "solved"
        new = ca.get(f"/v1/plans/{plan_id}/ranks/0", params={"iteration": 0}).json()
        assert len(new["microbatches"]) != len(old["microbatches"])  # the resubmission planned differently
        for _ in range(50):  # b drops its copy when the store's notification arrives (milliseconds)
            served = cb.get(f"/v1/plans/{plan_id}/ranks/0", params={"iteration": 0}).json()
            if served == new:
                break
        assert served == new


def test_delete_and_resubmit_on_one_server_serve_the_new_views(
    live_server_factory: Callable[..., LiveServer], store_location: str, tmp_path: Path
) -> None:
    server = live_server_factory(store_location, solver_processes=1, env={"SKRULL_TEST_MARKER_DIR": str(tmp_path)})
    server.start()
    doc = plan_request([[10, 20, 30, 40]], dp=1, cp=2, solver="test-flip")
    with httpx.Client(base_url=server.url, timeout=30) as client:
        plan_id = client.post("/v1/plans", json=doc).json()["id"]
        assert _final(client, plan_id) == "solved"
        old = client.get(f"/v1/plans/{plan_id}/ranks/0", params={"iteration": 0})
        assert client.delete(f"/v1/plans/{plan_id}").status_code == 204
        client.post("/v1/plans", json=doc)
        assert _final(client, plan_id) == "solved"
        new = client.get(f"/v1/plans/{plan_id}/ranks/0", params={"iteration": 0})
        assert new.json() != old.json() and new.headers["etag"] != old.headers["etag"]

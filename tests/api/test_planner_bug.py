"""A planner bug (a plan the validator refuses) is the service's fault: a 500 problem, never a 4xx."""

from __future__ import annotations

import pickle

from fastapi import FastAPI
from fastapi.testclient import TestClient

from skrull.api.errors import install_error_handlers
from skrull.solver.errors import PlannerBugError
from tests.api.conftest import plan_request

PROBLEM = "application/problem+json"


def test_a_job_whose_planner_makes_an_invalid_plan_fails_with_a_500_problem(shared_app: TestClient) -> None:
    plan_id = shared_app.post("/v1/plans", json=plan_request([[10, 20]], solver="test-invalid")).json()["id"]
    envelope = shared_app.get(f"/v1/plans/{plan_id}", params={"wait": 30, "until": "final"}).json()
    assert envelope["status"] == "failed" and envelope["plan"] is None
    error = envelope["error"]
    assert error["status"] == 500 and error["type"] == "urn:skrull:problem:planner-bug"
    assert error["solver"] == "test-invalid"
    assert any("more than once" in p for p in error["problems"])
    r = shared_app.get(f"/v1/plans/{plan_id}/ranks/0", params={"iteration": 0})
    assert r.status_code == 409 and "planner bug" in r.json()["detail"]


def test_a_planner_bug_raised_in_a_handler_answers_500_problem_json() -> None:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/bug")
    def bug() -> None:
        raise PlannerBugError("wlb", ["sequences scheduled more than once: [3]"])

    r = TestClient(app).get("/bug")
    assert r.status_code == 500 and r.headers["content-type"] == PROBLEM
    body = r.json()
    assert body["type"] == "urn:skrull:problem:planner-bug" and body["solver"] == "wlb"
    assert body["problems"] == ["sequences scheduled more than once: [3]"]


def test_a_planner_bug_crosses_process_boundaries_intact() -> None:
    exc = pickle.loads(pickle.dumps(PlannerBugError("hydraulis", ["a", "b"])))
    assert isinstance(exc, PlannerBugError) and (exc.solver, exc.problems) == ("hydraulis", ["a", "b"])
    assert not isinstance(exc, ValueError), "a planner bug must never pass for a user error"

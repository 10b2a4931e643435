"""The service in-process (TestClient) with a real SQLite file and a real solver process."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from skrull.api.schemas import CompareTable, PlanEnvelope, ProblemModel, RankViewModel
from skrull.solver.io import plan_from_dict, request_from_dict
from skrull.solver.profile import load_profile, profile_from_dict
from skrull.solver.validate import plan_problems
from tests.api.conftest import HAND_PROFILE, plan_request
from tests.api.coverage import assert_views_cover_every_token_once
from tests.api.scrape import families, samples

PROBLEM = "application/problem+json"


def solved(client: TestClient, doc: dict[str, Any], **headers: str) -> dict[str, Any]:
    r = client.post("/v1/plans", json=doc, headers=headers)
    assert r.status_code == 202, r.text
    plan_id = r.json()["id"]
    for _ in range(100):
        envelope = client.get(f"/v1/plans/{plan_id}", params={"wait": 5}).json()
        if envelope["status"] in ("solved", "failed"):
            return envelope
    raise AssertionError(f"plan {plan_id} never finished")


def test_submit_answers_202_with_location_then_the_solved_plan_validates(shared_app: TestClient) -> None:
    doc = plan_request([[30, 120, 7, 199], [64, 64]])
    r = shared_app.post("/v1/plans", json=doc)
    assert r.status_code == 202
    body = PlanEnvelope.model_validate(r.json())
    assert r.headers["location"] == f"/v1/plans/{body.id}"
    assert body.status in ("queued", "solving", "solved") and body.progress.iterations_total == 2
    envelope = solved(shared_app, doc)
    assert PlanEnvelope.model_validate(envelope).status == "solved"
    assert envelope["progress"] == {"iterations_solved": 2, "iterations_total": 2}
    assert plan_problems(plan_from_dict(envelope["plan"]), request_from_dict(doc)) == []


def test_resubmitting_the_same_request_answers_the_same_plan(shared_app: TestClient) -> None:
    doc = plan_request([[11, 22, 33]])
    first = shared_app.post("/v1/plans", json=doc)
    reordered = {k: doc[k] for k in reversed(list(doc))}
    again = shared_app.post("/v1/plans", json=reordered)
    assert again.status_code == 202
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers


def test_an_idempotency_key_reused_for_another_request_is_a_409_problem(shared_app: TestClient) -> None:
    key = {"Idempotency-Key": "run-1/step-42"}
    assert shared_app.post("/v1/plans", json=plan_request([[5, 6]]), headers=key).status_code == 202
    assert shared_app.post("/v1/plans", json=plan_request([[5, 6]]), headers=key).status_code == 202
    r = shared_app.post("/v1/plans", json=plan_request([[5, 7]]), headers=key)
    assert r.status_code == 409 and r.headers["content-type"] == PROBLEM
    assert r.json()["field"] == "Idempotency-Key" and r.json()["value"] == "run-1/step-42"


def test_rank_views_of_all_ranks_cover_every_token_exactly_once(shared_app: TestClient) -> None:
    batches = [[150, 3, 90, 40, 199, 1, 77], [200, 200, 5], [12]]
    envelope = solved(shared_app, plan_request(batches, dp=2, cp=4))
    plan_id = envelope["id"]
    views = []
    for iteration in range(3):
        for rank in range(8):
            r = shared_app.get(f"/v1/plans/{plan_id}/ranks/{rank}", params={"iteration": iteration})
            assert r.status_code == 200, r.text
            view = RankViewModel.model_validate(r.json()).model_dump()
            assert view["plan_id"] == plan_id and view["iteration"] == iteration and view["rank"] == rank
            assert view["num_tokens_in_iteration"] == sum(batches[iteration])
            views.append(view)
    assert_views_cover_every_token_once(views, [n for b in batches for n in b])


def test_a_rank_view_answers_304_to_its_etag(shared_app: TestClient) -> None:
    plan_id = solved(shared_app, plan_request([[100, 50, 20]]))["id"]
    url = f"/v1/plans/{plan_id}/ranks/1?iteration=0"
    first = shared_app.get(url)
    etag = first.headers["etag"]
    again = shared_app.get(url, headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == etag
    other = shared_app.get(f"/v1/plans/{plan_id}/ranks/2?iteration=0", headers={"If-None-Match": etag})
    assert other.status_code == 200 and other.headers["etag"] != etag


@pytest.mark.parametrize(
    ("path", "field", "detail"),
    [
        ("/ranks/4?iteration=0", "rank", "must be in 0..3"),
        ("/ranks/-1?iteration=0", "rank", "must be in 0..3"),
        ("/ranks/0?iteration=2", "iteration", "must be in 0..1"),
    ],
)
def test_unknown_rank_or_iteration_is_a_404_naming_the_valid_range(
    shared_app: TestClient, path: str, field: str, detail: str
) -> None:
    plan_id = solved(shared_app, plan_request([[10], [20]]))["id"]
    r = shared_app.get(f"/v1/plans/{plan_id}{path}")
    assert r.status_code == 404 and r.headers["content-type"] == PROBLEM
    problem = ProblemModel.model_validate(r.json())
    assert problem.field == field and detail in problem.detail


def test_unknown_plan_is_a_404_problem(shared_app: TestClient) -> None:
    for url in ("/v1/plans/0123abcd", "/v1/plans/0123abcd/ranks/0?iteration=0"):
        r = shared_app.get(url)
        assert r.status_code == 404 and r.json()["field"] == "plan_id" and r.json()["value"] == "0123abcd"


def test_multi_iteration_plans_publish_iterations_as_they_are_solved(shared_app: TestClient) -> None:
    # test-gated plans a batch only once this test opens its gate, so each step below sees exactly the
    # iterations solved so far, however the machine's load paces the solver process.
    from tests.api.plugin_planners import gate

    batches = [[10, 20], [30], [40], [50, 60]]
    doc = plan_request(batches, solver="test-gated", seed=1, time_budget_s=60.0)  # hard limit far past the test
    plan_id = shared_app.post("/v1/plans", json=doc).json()["id"]
    for k, batch in enumerate(batches):
        gate(os.environ["SKRULL_TEST_MARKER_DIR"], batch).touch()
        # Iteration k is served as soon as it is solved, while the later ones are still waiting.
        view = shared_app.get(f"/v1/plans/{plan_id}/ranks/0", params={"iteration": k, "wait": 60})
        assert view.status_code == 200, view.text
        if k + 1 < len(batches):
            envelope = shared_app.get(f"/v1/plans/{plan_id}").json()
            assert envelope["status"] == "solving" and envelope["plan"] is None
            assert envelope["progress"]["iterations_solved"] == k + 1
            assert shared_app.get(f"/v1/plans/{plan_id}/ranks/0", params={"iteration": k + 1}).status_code == 202
    envelope = solved(shared_app, doc)
    assert envelope["status"] == "solved" and envelope["progress"]["iterations_solved"] == len(batches)
    plan = plan_from_dict(envelope["plan"])
    assert plan_problems(plan, request_from_dict({**doc, "solver": "test-gated"})) == []
    assert plan.solve.objective_ms == pytest.approx(sum(it.estimated_ms for it in plan.iterations))


def test_a_rank_view_of_an_unsolved_iteration_answers_202_then_long_polls_to_200(shared_app: TestClient) -> None:
    doc = plan_request([[10, 20], [30], [40]], solver="test-slow", seed=2)
    plan_id = shared_app.post("/v1/plans", json=doc).json()["id"]
    early = shared_app.get(f"/v1/plans/{plan_id}/ranks/3", params={"iteration": 2})
    assert early.status_code == 202 and early.headers["retry-after"] == "1"
    assert early.json()["progress"]["iterations_total"] == 3
    start = time.monotonic()
    late = shared_app.get(f"/v1/plans/{plan_id}/ranks/3", params={"iteration": 2, "wait": 60})
    assert late.status_code == 200 and late.json()["iteration"] == 2
    assert time.monotonic() - start < 30  # woken when solved (about 1 s), not after the 60 s wait


def test_get_with_wait_returns_when_the_status_changes(shared_app: TestClient) -> None:
    doc = plan_request([[33, 44]], solver="test-slow", seed=3)
    plan_id = shared_app.post("/v1/plans", json=doc).json()["id"]
    start = time.monotonic()
    statuses = []
    while not statuses or statuses[-1] != "solved":
        statuses.append(shared_app.get(f"/v1/plans/{plan_id}", params={"wait": 60}).json()["status"])
    assert statuses[-1] == "solved" and len(statuses) <= 3
    assert time.monotonic() - start < 30  # each poll woken by a change, none waited its 60 s out


def test_get_with_wait_until_final_answers_once_the_plan_is_solved(shared_app: TestClient) -> None:
    doc = plan_request([[5], [6], [7]], solver="test-slow", seed=4)
    plan_id = shared_app.post("/v1/plans", json=doc).json()["id"]
    envelope = shared_app.get(f"/v1/plans/{plan_id}", params={"wait": 30, "until": "final"}).json()
    assert envelope["status"] == "solved" and envelope["progress"]["iterations_solved"] == 3


def test_a_failed_plan_reports_the_problem_and_its_rank_views_answer_409(shared_app: TestClient) -> None:
    envelope = solved(shared_app, plan_request([[10, 20]], solver="test-infeasible"))
    assert envelope["status"] == "failed" and envelope["plan"] is None
    assert envelope["error"]["type"] == "urn:skrull:problem:infeasible"
    assert "refuses 2 sequences" in envelope["error"]["detail"]
    r = shared_app.get(f"/v1/plans/{envelope['id']}/ranks/0", params={"iteration": 0})
    assert r.status_code == 409 and "refuses 2 sequences" in r.json()["detail"]


def test_profiles_list_read_upload_and_name_in_requests(shared_app: TestClient) -> None:
    names = {p["name"]: p["source"] for p in shared_app.get("/v1/profiles").json()["profiles"]}
    assert names["h100-80g/qwen2.5-0.5b"] == "bundled"
    bundled = shared_app.get("/v1/profiles/h100-80g/qwen2.5-0.5b")
    assert bundled.status_code == 200 and bundled.json()["memory"]["bucket_tokens"] == 26000

    measured = {**HAND_PROFILE, "name": "lab/h100-measured", "source": "measured 2025-01"}
    up = shared_app.post("/v1/profiles", json=measured)
    assert up.status_code == 201 and up.headers["location"] == "/v1/profiles/lab/h100-measured"
    assert up.json()["source"] == "measured 2025-01"
    assert shared_app.post("/v1/profiles", json=measured).status_code == 200
    changed = {**measured, "microbatch_ms": 9.0}
    conflict = shared_app.post("/v1/profiles", json=changed)
    assert conflict.status_code == 409 and conflict.json()["field"] == "name"
    listed = {p["name"]: p["source"] for p in shared_app.get("/v1/profiles").json()["profiles"]}
    assert listed["lab/h100-measured"] == "uploaded"

    envelope = solved(shared_app, {**plan_request([[150, 30]]), "profile": "lab/h100-measured"})
    assert envelope["status"] == "solved" and envelope["plan"]["bucket_tokens"] == 100


def test_profiles_are_served_as_the_planning_library_writes_them(shared_app: TestClient) -> None:
    # one writer of the format (Profile.to_dict): the service neither re-serializes nor rewrites numbers
    bundled = shared_app.get("/v1/profiles/h100-80g/qwen2.5-7b")
    assert bundled.json() == load_profile("h100-80g/qwen2.5-7b").to_dict()
    measured = {**HAND_PROFILE, "name": "lab/served-as-written", "notes": {"gpus": 8}}
    up = shared_app.post("/v1/profiles", json=measured)
    written = profile_from_dict(measured, path="profile").to_dict()
    assert up.status_code == 201 and up.json() == written
    assert shared_app.get("/v1/profiles/lab/served-as-written").json() == written


@pytest.mark.parametrize(
    ("doc", "status", "field"),
    [
        ({**HAND_PROFILE, "name": "h100-80g/qwen2.5-0.5b"}, 409, "name"),
        (
            {**HAND_PROFILE, "name": "lab/x", "compute": {**HAND_PROFILE["compute"], "ms_per_tflop": -1}},
            422,
            "profile.compute.ms_per_tflop",
        ),
        ({**HAND_PROFILE, "name": "lab/y", "memory": {"bucket_tokens": 0}}, 422, "profile.memory.bucket_tokens"),
        ({k: v for k, v in HAND_PROFILE.items() if k != "name"}, 422, "name"),
        ({**HAND_PROFILE, "name": "../etc/passwd"}, 422, "name"),
        ([1, 2], 422, "profile"),
    ],
)
def test_bad_profile_uploads_are_refused_naming_the_field(
    shared_app: TestClient, doc: Any, status: int, field: str
) -> None:
    r = shared_app.post("/v1/profiles", json=doc)
    assert r.status_code == status and r.headers["content-type"] == PROBLEM
    assert r.json()["field"] == field


def test_unknown_profile_is_a_404_problem(shared_app: TestClient) -> None:
    r = shared_app.get("/v1/profiles/no/such")
    assert r.status_code == 404 and r.json()["value"] == "no/such" and "h100-80g/qwen2.5-7b" in r.json()["detail"]


def test_compare_answers_a_table_with_one_row_per_solver(shared_app: TestClient) -> None:
    doc = {**plan_request([[150, 30, 60, 10], [100]]), "solvers": ["skrull", "packed", "deepspeed"]}
    r = shared_app.post("/v1/compare", json=doc)
    assert r.status_code == 200, r.text
    table = CompareTable.model_validate(r.json())
    assert table.reference == "deepspeed" and table.num_sequences == 5 and table.num_iterations == 2
    rows = [dict(zip(table.columns, row, strict=True)) for row in table.rows]
    assert [row["solver"] for row in rows] == ["skrull", "packed", "deepspeed"]
    for row in rows:
        assert row["iteration_ms"] >= row["lower_bound_ms"] > 0 and row["error"] is None
    assert rows[2]["speedup"] == pytest.approx(1.0)


def test_compare_refuses_unknown_solvers_naming_the_position(shared_app: TestClient) -> None:
    r = shared_app.post("/v1/compare", json={**plan_request([[10]]), "solvers": ["skrull", "magic"]})
    assert r.status_code == 422 and r.json()["field"] == "solvers[1]" and r.json()["value"] == "magic"


def test_health_reports_store_and_solver_processes(shared_app: TestClient) -> None:
    r = shared_app.get("/healthz")
    assert r.status_code == 200
    assert r.json()["status"] == "ok" and r.json()["solver_processes"] == {"configured": 1, "alive": 1}


def test_metrics_count_solves_queue_plans_and_errors(shared_app: TestClient) -> None:
    solved(shared_app, plan_request([[77, 78]]))
    shared_app.get("/v1/plans/does-not-exist")
    text = shared_app.get("/metrics").text
    assert families(text)["skrull_solve_duration_seconds"] == "histogram"
    got = samples(text)
    assert got[("skrull_solve_duration_seconds_count", (("solver", "skrull"), ("status", "solved")))] >= 1
    assert ("skrull_queue_depth", ()) in got
    assert got[("skrull_plans_served_total", (("kind", "plan"),))] >= 1
    assert got[("skrull_errors_total", (("status", "404"), ("type", "unknown-plan")))] >= 1
    route = (("code", "200"), ("method", "GET"), ("route", "/v1/plans/{plan_id}"))
    assert got[("skrull_http_request_duration_seconds_count", route)] >= 1


def test_openapi_has_stable_operation_ids_and_docs(shared_app: TestClient) -> None:
    spec = shared_app.get("/openapi.json").json()
    ops = {op["operationId"] for path in spec["paths"].values() for op in path.values()}
    assert ops == {
        "submitPlan",
        "deletePlan",
        "getPlan",
        "getRankView",
        "getPlanTimeline",
        "viewPlan",
        "comparePlanners",
        "listProfiles",
        "getProfile",
        "uploadProfile",
        "health",
        "metrics",
    }
    assert shared_app.get("/docs").status_code == 200
    submit = spec["paths"]["/v1/plans"]["post"]
    assert "application/problem+json" in submit["responses"]["422"]["content"]
    assert json.dumps(spec).count("Idempotency-Key") >= 1


def test_compare_answers_every_figure_the_cli_table_prints(shared_app: TestClient) -> None:
    # one function makes both: the service's rows are the library's compare rows, whole
    from skrull.solver.io import request_from_dict
    from skrull.solver.reports.compare import compare

    doc = {**plan_request([[150, 30, 60, 10]]), "solvers": ["skrull", "ilp-flex"], "time_budget_s": 0.5}
    table = CompareTable.model_validate(shared_app.post("/v1/compare", json=doc).json())
    for figure in ("layout", "bound_ms", "gap", "ratio_to_bound", "imbalance_degree", "peak_bucket_use", "pending"):
        assert figure in table.columns
    rows = {row[0]: dict(zip(table.columns, row, strict=True)) for row in table.rows}
    library, _ = compare(request_from_dict({k: v for k, v in doc.items() if k != "solvers"}), ["skrull"])
    expected = {k: v for k, v in dataclasses.asdict(library[0]).items() if k != "planning_ms"}
    assert {k: v for k, v in rows["skrull"].items() if k != "planning_ms"} == expected
    # ilp-flex starts from the table's best plan (here skrull's static one), so it is never behind it
    assert rows["ilp-flex"]["bound_ms"] is not None and rows["ilp-flex"]["layout"] in ("static", "flexible")
    assert rows["ilp-flex"]["total_ms"] <= rows["skrull"]["total_ms"] * (1 + 1e-9)

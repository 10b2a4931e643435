"""Bad input of every kind gets one application/problem+json answer naming the field and the value,
and stores nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from skrull.api.schemas import ProblemModel
from tests.api.conftest import HAND_PROFILE, plan_request, running_app

PROBLEM = "application/problem+json"
GOOD = plan_request([[10, 20]])


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    db: Path = tmp_path_factory.mktemp("errors") / "skrull.db"
    with running_app(
        db,
        max_body_bytes=4096,
        max_sequences=50,
        max_iterations=4,
        max_gpus=64,
        max_time_budget_s=10.0,
        max_wait_s=5.0,
    ) as client:
        yield client


def problem_of(r: Any, status: int) -> ProblemModel:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == PROBLEM
    problem = ProblemModel.model_validate(r.json())
    assert problem.status == status and problem.type.startswith("urn:skrull:problem:")
    return problem


def without(key: str) -> dict[str, Any]:
    return {k: v for k, v in GOOD.items() if k != key}


@pytest.mark.parametrize(
    ("doc", "field", "value"),
    [
        (without("batches"), "batches", None),
        ({**GOOD, "batches": []}, "batches", []),
        ({**GOOD, "batches": "10,20"}, "batches", "10,20"),
        ({**GOOD, "batches": [[10, 0]]}, "batches[0][1]", 0),
        ({**GOOD, "batches": [[10], [-5]]}, "batches[1][0]", -5),
        ({**GOOD, "batches": [[10, "20"]]}, "batches[0][1]", "20"),
        ({**GOOD, "batches": [[10, 2.5]]}, "batches[0][1]", 2.5),
        ({**GOOD, "batches": [[10, True]]}, "batches[0][1]", True),
        ({**GOOD, "batches": [[10], []]}, "batches[1]", []),
        ({**GOOD, "batches": [[10, 201]]}, "batches[0][1]", 201),
        (without("parallel"), "parallel", None),
        ({**GOOD, "parallel": {"dp": 0, "cp": 2}}, "parallel.dp", 0),
        ({**GOOD, "parallel": {"dp": 2, "cp": "8"}}, "parallel.cp", "8"),
        ({**GOOD, "parallel": {"dp": 2, "cp": 2, "tp": 4}}, "parallel.tp", 4),
        ({**GOOD, "solver": "magic"}, "solver", "magic"),
        ({**GOOD, "profile": "no/such-gpu"}, "profile", "no/such-gpu"),
        ({**GOOD, "profile": {**HAND_PROFILE, "microbatch_ms": "fast"}}, "profile.microbatch_ms", "fast"),
        ({**GOOD, "profile": {**HAND_PROFILE, "comm": None}}, "profile.comm", None),
        ({**GOOD, "time_budget_s": 0}, "time_budget_s", 0),
        ({**GOOD, "time_budget_s": "1s"}, "time_budget_s", "1s"),
        ({**GOOD, "bucket_tokens": 0}, "bucket_tokens", 0),
        ({**GOOD, "backend": "gurobi"}, "backend", "gurobi"),
        ({**GOOD, "seed": -1}, "seed", -1),
        ([1, 2, 3], "body", [1, 2, 3]),
    ],
)
def test_invalid_requests_are_422_problems_naming_field_and_value(
    limited: TestClient, doc: Any, field: str, value: Any
) -> None:
    before = limited.get("/metrics").text.count("skrull_submissions_total")
    problem = problem_of(limited.post("/v1/plans", json=doc), 422)
    assert problem.field == field
    assert problem.value == value
    assert problem.detail.startswith(f"{field}: ")
    assert limited.get("/healthz").json()["jobs"] == {} or before >= 0
    assert limited.get("/healthz").json()["jobs"].get("queued", 0) == 0


def test_a_sequence_longer_than_the_group_names_its_id_and_the_limit(limited: TestClient) -> None:
    problem = problem_of(limited.post("/v1/plans", json={**GOOD, "batches": [[10], [5, 450]]}), 422)
    assert problem.field == "batches[1][1]" and problem.value == 450
    assert "sequence 2 has 450 tokens, more than cp * bucket_tokens = 200" in problem.detail


def test_malformed_json_is_a_problem_with_the_position(limited: TestClient) -> None:
    r = limited.post("/v1/plans", content=b'{"batches": [[1, 2]', headers={"content-type": "application/json"})
    problem = problem_of(r, 422)
    assert problem.type.endswith("malformed-json") and "position" in problem.detail


@pytest.mark.parametrize(
    ("doc", "field", "value", "limit"),
    [
        ({**GOOD, "batches": [[1]] * 5}, "batches", 5, "at most 4 batches"),
        ({**GOOD, "batches": [[1] * 30, [1] * 21]}, "batches", 51, "at most 50 sequences"),
        ({**GOOD, "parallel": {"dp": 16, "cp": 8}}, "parallel", {"dp": 16, "cp": 8}, "at most 64"),
        ({**GOOD, "time_budget_s": 11}, "time_budget_s", 11, "at most 10.0 s"),
    ],
)
def test_requests_over_the_limits_are_refused_quoting_the_limit(
    limited: TestClient, doc: Any, field: str, value: Any, limit: str
) -> None:
    problem = problem_of(limited.post("/v1/plans", json=doc), 422)
    assert problem.type.endswith("limit-exceeded")
    assert problem.field == field and problem.value == value and limit in problem.detail


def test_a_body_over_the_size_limit_is_413_before_it_is_read(limited: TestClient) -> None:
    big = {**GOOD, "batches": [[1] * 3000]}
    problem = problem_of(limited.post("/v1/plans", json=big), 413)
    assert "at most 4096 bytes" in problem.detail


def test_a_chunked_body_over_the_size_limit_is_413(limited: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"batches": [['
        for _ in range(2000):
            yield b"1, "
        yield b"1]]}"

    r = limited.post("/v1/plans", content=chunks(), headers={"content-type": "application/json"})
    problem_of(r, 413)


@pytest.mark.parametrize(
    ("url", "status", "field", "value"),
    [
        ("/v1/plans/abc?wait=6", 422, "wait", 6.0),
        ("/v1/plans/abc?wait=-1", 422, "wait", "-1"),
        ("/v1/plans/abc?wait=soon", 422, "wait", "soon"),
        ("/v1/plans/abc/ranks/x?iteration=0", 422, "rank", "x"),
        ("/v1/plans/abc/ranks/0", 422, "iteration", None),
        ("/v1/plans/abc/ranks/0?iteration=0&wait=60", 422, "wait", 60.0),
        ("/v1/plans/abc/ranks/0?iteration=0", 404, "plan_id", "abc"),
    ],
)
def test_bad_query_and_path_parameters_are_problems(
    limited: TestClient, url: str, status: int, field: str, value: Any
) -> None:
    problem = problem_of(limited.get(url), status)
    assert problem.field == field and problem.value == value


def test_unknown_routes_and_methods_are_problems(limited: TestClient) -> None:
    assert problem_of(limited.get("/v2/plans"), 404).type.endswith("not-found")
    assert problem_of(limited.delete("/v1/profiles"), 405).type.endswith("method-not-allowed")


def test_refusals_store_nothing(limited: TestClient) -> None:
    limited.post("/v1/plans", json={**GOOD, "batches": [[0]]})
    limited.post("/v1/plans", json={**GOOD, "solver": "magic"})
    assert limited.get("/healthz").json()["jobs"] == {}


def test_a_full_queue_answers_503_with_retry_after_but_replays_still_work(tmp_path: Path) -> None:
    with running_app(tmp_path / "skrull.db", solver_processes=0, max_queued_jobs=1) as client:
        first = client.post("/v1/plans", json=plan_request([[1, 2]]))
        assert first.status_code == 202
        full = client.post("/v1/plans", json=plan_request([[3, 4]]))
        problem = problem_of(full, 503)
        assert problem.type.endswith("queue-full") and full.headers["retry-after"] == "5"
        assert client.post("/v1/plans", json=plan_request([[1, 2]])).json()["id"] == first.json()["id"]


def test_a_malformed_profile_upload_is_a_problem(limited: TestClient) -> None:
    r = limited.post("/v1/profiles", content=b'{"name": ', headers={"content-type": "application/json"})
    assert problem_of(r, 422).type.endswith("malformed-json")


@pytest.mark.parametrize(("typo", "meant"), [("paralel", "parallel"), ("batch", "batches"), ("profil", "profile")])
def test_a_misspelt_field_is_named_before_the_field_it_leaves_missing(
    limited: TestClient, typo: str, meant: str
) -> None:
    doc = plan_request([[10, 20]])
    doc[typo] = doc.pop(meant)
    problem = problem_of(limited.post("/v1/plans", json=doc), 422).model_dump()
    assert problem["field"] == typo and "unknown field" in problem["detail"]
    fields = [e["field"] for e in problem["errors"]]
    assert fields[0] == typo and fields[1:] in ([], [meant])  # a required field it leaves missing comes second


def test_a_sequence_all_gather_cannot_hold_with_its_gathered_kv_names_its_id_and_the_limit(
    limited: TestClient,
) -> None:
    """The profile charges the gathered K/V (r = 0.5): on CP2 with bucket 100, ceil(S/2) + ceil(S/4) <= 100
    holds up to S = 132 (66 + 33; 133 needs 67 + 34), under cp * bucket_tokens = 200; with Ulysses allowed on
    a group dividing the heads the whole 200 is placeable."""
    profile = {
        **HAND_PROFILE,
        "memory": {**HAND_PROFILE["memory"], "activation_bytes_per_token": 1000.0, "kv_bytes_per_token": 500.0},
    }
    doc = {**GOOD, "profile": profile, "batches": [[10], [5, 150]]}
    problem = problem_of(limited.post("/v1/plans", json=doc), 422)
    assert problem.field == "batches[1][1]" and problem.value == 150
    assert "sequence 2 has 150 tokens, more than 132," in problem.detail and "gathered K/V" in problem.detail
    ulysses = {
        **profile,
        "heads": {"attention": 4, "kv": 2},
        "comm_a2a": {"bytes_per_token": 4096, "ms_per_mib": 0.001, "fixed_ms": 0.2},
    }
    r = limited.post("/v1/plans", json={**doc, "profile": ulysses, "cp_modes": ["allgather", "ulysses"]})
    assert r.status_code == 202, r.text


def test_the_limit_follows_the_profiles_gathered_kv_rule_and_a_bad_rule_is_named(limited: TestClient) -> None:
    """``memory.gathered_kv: key_prefixes`` (r = 0.5, CP2, bucket 100): ceil(S/2) + ceil(0.5 * 5/4 * S) <= 100
    holds up to S = 88 (44 + 55; 89 needs 45 + 56), below the (N-1)/N rule's 132; an unknown rule is a 422
    naming ``profile.memory.gathered_kv`` and the value."""
    memory = {**HAND_PROFILE["memory"], "activation_bytes_per_token": 1000.0, "kv_bytes_per_token": 500.0}
    profile = {**HAND_PROFILE, "memory": {**memory, "gathered_kv": "key_prefixes"}}
    r = limited.post("/v1/plans", json={**GOOD, "profile": profile, "batches": [[10], [5, 88]]})
    assert r.status_code == 202, r.text
    problem = problem_of(limited.post("/v1/plans", json={**GOOD, "profile": profile, "batches": [[10], [5, 89]]}), 422)
    assert problem.field == "batches[1][1]" and "more than 88," in problem.detail
    bad = {**HAND_PROFILE, "memory": {**memory, "gathered_kv": "everything"}}
    problem = problem_of(limited.post("/v1/plans", json={**GOOD, "profile": bad}), 422)
    assert problem.field == "profile.memory.gathered_kv" and problem.value == "everything"

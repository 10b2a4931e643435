"""Hostile input: schemathesis generates requests from the service's own OpenAPI document and sends them to
a real server over HTTP, once with bearer tokens and once open (no tokens), with every check schemathesis
has: no 5xx, documented status codes, content types, headers and bodies, data the schema calls invalid
refused, data it calls valid accepted, and authentication declared exactly when it is enforced. Few
examples per operation, so each run stays a smoke test of seconds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig

from tests.api.conftest import LiveServer

TOKEN = "fuzz-token"
LIMITS = {
    # small limits, so generated requests stay cheap for the planners a fuzzed /v1/compare runs
    "SKRULL_MAX_SEQUENCES": "64",
    "SKRULL_MAX_ITERATIONS": "4",
    "SKRULL_MAX_GPUS": "64",
    "SKRULL_MAX_TIME_BUDGET_S": "0.5",
    "SKRULL_MAX_WAIT_S": "0.2",
    "SKRULL_MAX_COMPARE_SOLVERS": "2",
    "SKRULL_MAX_BODY_BYTES": "65536",
}
#: What a schema cannot say, refused with 422 naming the field even when the data fits the schema: a
#: sequence longer than ``cp * bucket_tokens``, a budget too small for the planner, an unknown profile
#: name or a malformed inline profile, ``dp * cp`` over SKRULL_MAX_GPUS (api/openapi.py lists them). Only
#: the operations that take such a body may answer 422 to valid data; every other operation must accept it.
SEMANTIC_422 = ("submitPlan", "comparePlanners", "uploadProfile")
CONFIG = {
    "operations": [
        {
            "include-operation-id": operation,
            "checks": {
                "positive_data_acceptance": {"expected-statuses": ["2xx", "3xx", "401", "403", "404", "409", "422"]}
            },
        }
        for operation in SEMANTIC_422
    ]
}
HYPOTHESIS = settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much, HealthCheck.too_slow],
)


def _serve(root: Path, env: dict[str, str]) -> LiveServer:
    # no test plugins: a compare of every registered planner would run the one that kills its process
    return LiveServer(root / "skrull.db", solver_processes=0, env={**LIMITS, "SKRULL_PLUGINS": "", **env}).start()


@pytest.fixture(scope="module")
def server_with_tokens(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # failed authentications unlimited here: schemathesis sends many on purpose, and the per-address limit
    # (tests/api/test_access.py) would answer its later checks with 429 instead of what they test
    env = {"SKRULL_SUBMIT_TOKENS": TOKEN, "SKRULL_AUTH_FAILURES_PER_S": "0"}
    server = _serve(tmp_path_factory.mktemp("fuzz-tokens"), env)
    yield server
    server.close()


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = _serve(tmp_path_factory.mktemp("fuzz-open"), {})
    yield server
    server.close()


def _schema(server: LiveServer) -> Any:
    return schemathesis.openapi.from_url(f"{server.url}/openapi.json", config=SchemathesisConfig.from_dict(CONFIG))


@pytest.fixture(scope="module")
def schema_with_tokens(server_with_tokens: LiveServer) -> Any:
    return _schema(server_with_tokens)


@pytest.fixture(scope="module")
def open_schema(open_server: LiveServer) -> Any:
    return _schema(open_server)


with_tokens = schemathesis.pytest.from_fixture("schema_with_tokens")
without_tokens = schemathesis.pytest.from_fixture("open_schema")


@with_tokens.parametrize()
@HYPOTHESIS
def test_a_server_with_tokens_answers_every_generated_request_as_its_schema_says(case: Any) -> None:
    case.call_and_validate(timeout=30, headers={"Authorization": f"Bearer {TOKEN}"})


@without_tokens.parametrize()
@HYPOTHESIS
def test_an_open_server_answers_every_generated_request_as_its_schema_says(case: Any) -> None:
    case.call_and_validate(timeout=30)


def test_the_security_requirement_is_declared_only_when_tokens_are_enforced(
    server_with_tokens: LiveServer, open_server: LiveServer
) -> None:
    import httpx

    guarded = httpx.get(f"{server_with_tokens.url}/openapi.json").json()
    open_doc = httpx.get(f"{open_server.url}/openapi.json").json()
    submit = ("/v1/plans", "post")
    assert guarded["paths"][submit[0]][submit[1]]["security"] == [{"HTTPBearer": []}]
    assert "HTTPBearer" in guarded["components"]["securitySchemes"]
    assert all("security" not in op for path in open_doc["paths"].values() for op in path.values())
    assert "securitySchemes" not in open_doc["components"]
    assert httpx.post(f"{server_with_tokens.url}/v1/plans", json={}).status_code == 401
    assert httpx.get(f"{open_server.url}/v1/profiles").status_code == 200


def test_the_published_limits_are_the_limits_in_force(open_server: LiveServer) -> None:
    import httpx

    doc = httpx.get(f"{open_server.url}/openapi.json").json()
    request = doc["components"]["schemas"]["PlanRequestIn"]
    assert request["additionalProperties"] is False
    batches = request["properties"]["batches"]
    assert (batches["minItems"], batches["maxItems"]) == (1, 4)
    assert (batches["items"]["minItems"], batches["items"]["maxItems"]) == (1, 64)
    assert batches["items"]["items"] == {"type": "integer", "minimum": 1, "maximum": 2**40}
    wait = next(p for p in doc["paths"]["/v1/plans/{plan_id}"]["get"]["parameters"] if p["name"] == "wait")
    assert (wait["schema"]["minimum"], wait["schema"]["maximum"]) == (0, 0.2)
    over = httpx.get(f"{open_server.url}/v1/plans/x?wait=0.3")
    assert over.status_code == 422 and over.json()["field"] == "wait"
    empty = {"batches": [], "parallel": {"dp": 1, "cp": 1}, "time_budget_s": 0.1}
    refused = httpx.post(f"{open_server.url}/v1/plans", json=empty)
    assert (refused.status_code, refused.json()["field"]) == (422, "batches")

"""Hostile input: schemathesis generates requests from the service's own OpenAPI schema and sends them to
a real server over HTTP; no answer may be a 5xx, and every answer must match the schema (status code,
content type, body, headers). Few examples per operation, so this stays a smoke test of seconds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance

from tests.api.conftest import LiveServer

LIMITS = {
    # small limits, so generated requests stay cheap for the planners a fuzzed /v1/compare runs
    "SKRULL_MAX_SEQUENCES": "64",
    "SKRULL_MAX_ITERATIONS": "4",
    "SKRULL_MAX_GPUS": "64",
    "SKRULL_MAX_TIME_BUDGET_S": "0.5",
    "SKRULL_MAX_WAIT_S": "0.2",
    "SKRULL_MAX_COMPARE_SOLVERS": "2",
    "SKRULL_MAX_BODY_BYTES": "65536",
    # the schema declares bearer authentication on /v1: run with a token, as a deployment would
    "SKRULL_SUBMIT_TOKENS": "fuzz-token",
}


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root: Path = tmp_path_factory.mktemp("fuzz")
    server = LiveServer(root / "skrull.db", solver_processes=0, env=LIMITS)
    server.start()
    yield server
    server.close()


@pytest.fixture(scope="module")
def api_schema(fuzz_server: LiveServer) -> Any:
    return schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much, HealthCheck.too_slow],
)
def test_no_generated_request_gets_a_server_error_or_breaks_the_schema(case: Any) -> None:
    # A request valid by the schema may still be refused with 422 naming the field: the schema cannot say
    # that a sequence must fit its GPUs' memory, nor the limits in force (SKRULL_MAX_*). Everything else
    # is checked: no 5xx, documented status codes, content types, headers and bodies.
    case.call_and_validate(
        timeout=30, headers={"Authorization": "Bearer fuzz-token"}, excluded_checks=[positive_data_acceptance]
    )

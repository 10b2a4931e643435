"""What a real server accepts (202) its planner can plan: every check the planner makes of the request
runs before the answer, so none of these is accepted and then failed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import HAND_PROFILE, LiveServer, plan_request

ULYSSES_PROFILE = {
    **HAND_PROFILE,
    "heads": {"attention": 6, "kv": 2},
    "comm_a2a": {"bytes_per_token": 2**20, "ms_per_mib": 0.01, "fixed_ms": 2.5},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    folder: Path = tmp_path_factory.mktemp("plannable")
    live = LiveServer(folder / "jobs.db", solver_processes=1).start()
    try:
        yield live
    finally:
        live.close()


def post(server: LiveServer, doc: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/plans", json=doc, timeout=60)


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        # a planner that plans all-gather only, asked for ulysses alone
        (
            {**plan_request([[10, 20]], solver="round-robin"), "profile": ULYSSES_PROFILE, "cp_modes": ["ulysses"]},
            "cp_modes",
        ),
        # ulysses alone on a CP group of 4 that does not divide 6 heads
        ({**plan_request([[10, 20]], cp=4), "profile": ULYSSES_PROFILE, "cp_modes": ["ulysses"]}, "cp_modes"),
        # a planner that plans ulysses only, on that group, though the request allows all-gather
        (
            {
                **plan_request([[10, 20]], cp=4, solver="xtuner"),
                "profile": ULYSSES_PROFILE,
                "cp_modes": ["allgather", "ulysses"],
            },
            "parallel.cp",
        ),
        # an inline profile far past the size of a stored one
        ({**plan_request([[10, 20]]), "profile": {**HAND_PROFILE, "notes": "x" * 200_000}}, "profile"),
    ],
)
def test_a_request_its_planner_would_refuse_is_refused_before_the_202(
    server: LiveServer, doc: dict[str, Any], field: str
) -> None:
    answer = post(server, doc)
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"] == field, answer.text


def test_what_is_accepted_is_solved(server: LiveServer) -> None:
    doc = {**plan_request([[10, 20]], cp=2), "profile": ULYSSES_PROFILE, "cp_modes": ["ulysses"]}
    plan_id = post(server, doc).json()["id"]
    envelope = httpx.get(f"{server.url}/v1/plans/{plan_id}?wait=60&until=final", timeout=120).json()
    assert envelope["status"] == "solved", envelope

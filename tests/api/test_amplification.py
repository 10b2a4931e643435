"""A small request cannot make the service hold or send large answers: rank views past
``SKRULL_MAX_VIEW_TOKENS`` are paged (and the pages join to the whole view), plans past
``SKRULL_MAX_PLAN_TOKENS`` fail naming the limit, and the view caches stay within their bytes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from skrull.api.client import PlanningClient
from skrull.api.sizes import json_tokens
from skrull.solver.io import plan_from_dict
from skrull.solver.worker_view import plan_rank_view
from tests.api.conftest import plan_request, running_app

#: Every sequence fills a whole 512-GPU group (bucket 100 tokens): each microbatch lists 512 ranks.
CP = 512
AMPLIFYING = plan_request([[100 * CP] * 6], dp=1, cp=CP)


def final(client: TestClient, plan_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        envelope: dict[str, Any] = client.get(f"/v1/plans/{plan_id}?wait=10&until=final").json()
        if envelope["status"] in ("solved", "failed"):
            return envelope
    raise AssertionError(f"plan {plan_id} not final")


def test_long_rank_views_are_paged_and_the_pages_join_to_the_whole_view(tmp_path: Path) -> None:
    with running_app(tmp_path / "jobs.db", max_view_tokens=1100, cache_bytes=4 * 2**20) as client:
        plan_id = client.post("/v1/plans", json=AMPLIFYING).json()["id"]
        envelope = final(client, plan_id)
        assert envelope["status"] == "solved", envelope
        plan = plan_from_dict(envelope["plan"])
        lengths = [n for batch in AMPLIFYING["batches"] for n in batch]
        for rank in (0, 7, CP - 1):
            expected = plan_rank_view(plan, lengths, iteration=0, rank=rank).to_dict(plan_id=plan_id)
            first = client.get(f"/v1/plans/{plan_id}/ranks/{rank}?iteration=0")
            assert first.status_code == 200, first.text
            doc = first.json()
            assert doc["page"] == 0 and doc["pages"] > 1
            microbatches = list(doc["microbatches"])
            for page in range(1, doc["pages"]):
                r = client.get(f"/v1/plans/{plan_id}/ranks/{rank}?iteration=0&page={page}")
                assert r.status_code == 200 and json_tokens(r.content) <= 1100 + 16, r.text[:200]
                assert r.json()["page"] == page
                microbatches.extend(r.json()["microbatches"])
            assert {**expected, "microbatches": microbatches} == expected
            past = client.get(f"/v1/plans/{plan_id}/ranks/{rank}?iteration=0&page={doc['pages']}")
            assert past.status_code == 422 and past.json()["field"] == "page"

        # the worker's client joins the pages itself
        def forward(request: httpx.Request) -> httpx.Response:
            r = client.request(request.method, str(request.url), headers=request.headers, content=request.content)
            return httpx.Response(r.status_code, headers=r.headers, content=r.content)

        with PlanningClient("http://testserver", transport=httpx.MockTransport(forward)) as worker:
            joined = worker.rank_view(plan_id, 5, 0, timeout_s=5)
        assert joined == plan_rank_view(plan, lengths, iteration=0, rank=5).to_dict(plan_id=plan_id)
        views = client.app.state.service.views  # type: ignore[attr-defined]
        assert views.cached_bytes <= 4 * 2**20


def test_a_microbatch_longer_than_a_page_is_413_naming_the_limit(tmp_path: Path) -> None:
    with running_app(tmp_path / "jobs.db", max_view_tokens=1024) as client:
        doc = plan_request([[100 * 2048]], dp=1, cp=2048)
        plan_id = client.post("/v1/plans", json=doc).json()["id"]
        assert final(client, plan_id)["status"] == "solved"
        r = client.get(f"/v1/plans/{plan_id}/ranks/0?iteration=0")
        assert r.status_code == 413, r.text
        problem = r.json()
        assert problem["limit"] == 1024 and "SKRULL_MAX_VIEW_TOKENS" in problem["detail"]


@pytest.mark.parametrize(
    ("limit", "setting"),
    [("max_plan_tokens", "SKRULL_MAX_PLAN_TOKENS"), ("max_iteration_tokens", "SKRULL_MAX_ITERATION_TOKENS")],
)
def test_a_plan_over_the_token_limit_fails_naming_it(tmp_path: Path, limit: str, setting: str) -> None:
    with running_app(tmp_path / "jobs.db", **{limit: 2000}) as client:
        doc = plan_request([[100 * CP] * 3, [100 * CP] * 3], dp=1, cp=CP)  # two iterations: streamed
        plan_id = client.post("/v1/plans", json=doc).json()["id"]
        envelope = final(client, plan_id)
        assert envelope["status"] == "failed", envelope
        error = envelope["error"]
        assert error["status"] == 422 and error["field"] == "plan" and setting in error["detail"], error

"""Access control: bearer tokens with submit and read-only roles (401/403 as problem+json), per-token rate
limits (429 with Retry-After), and the open API when no tokens are configured."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from skrull.api.access import RateLimiter
from tests.api.conftest import plan_request, running_app

PROBLEM = "application/problem+json"
SUBMIT = {"Authorization": "Bearer submit-secret"}
READ = {"Authorization": "Bearer worker-secret"}


def test_tokens_are_enforced_with_problem_json(tmp_path: Path) -> None:
    with running_app(
        tmp_path / "skrull.db", solver_processes=0, submit_tokens="submit-secret", read_tokens="worker-secret"
    ) as client:
        doc = plan_request([[10, 20]])
        missing = client.post("/v1/plans", json=doc)
        unknown = client.get("/v1/profiles", headers={"Authorization": "Bearer guess"})
        basic = client.get("/v1/profiles", headers={"Authorization": "Basic dXNlcjpwdw=="})
        forbidden = client.post("/v1/plans", json=doc, headers=READ)
        for r, status in ((missing, 401), (unknown, 401), (basic, 401), (forbidden, 403)):
            assert r.status_code == status and r.headers["content-type"] == PROBLEM
            assert r.json()["status"] == status
        assert missing.headers["www-authenticate"].startswith("Bearer")
        assert "invalid_token" in unknown.headers["www-authenticate"]
        assert "submit token" in forbidden.json()["detail"]
        assert client.get("/healthz").status_code == 200  # probes need no token

        accepted = client.post("/v1/plans", json=doc, headers=SUBMIT)
        assert accepted.status_code == 202
        plan_id = accepted.json()["id"]
        assert client.get(f"/v1/plans/{plan_id}", headers=READ).status_code == 200
        assert client.get(f"/v1/plans/{plan_id}", headers=SUBMIT).status_code == 200
        assert client.get(f"/v1/plans/{plan_id}").status_code == 401
        # nothing the refused requests sent was stored
        assert client.get("/metrics").text.count('skrull_submissions_total{outcome="created"} 1.0') == 1


def test_without_tokens_the_api_is_open(tmp_path: Path) -> None:
    with running_app(tmp_path / "skrull.db", solver_processes=0) as client:
        assert client.post("/v1/plans", json=plan_request([[10]])).status_code == 202


def test_a_token_over_its_rate_gets_429_with_retry_after_and_others_are_unaffected(tmp_path: Path) -> None:
    with running_app(
        tmp_path / "skrull.db",
        solver_processes=0,
        submit_tokens="submit-secret",
        read_tokens="worker-secret",
        rate_limit_per_s=0.2,
        rate_limit_burst=3,
    ) as client:
        answers = [client.get("/v1/profiles", headers=READ) for _ in range(5)]
        assert [r.status_code for r in answers] == [200, 200, 200, 429, 429]
        limited = answers[3]
        assert limited.headers["content-type"] == PROBLEM
        assert int(limited.headers["retry-after"]) == 5  # (1 - 0 tokens) / 0.2 per s
        assert limited.json()["type"] == "urn:skrull:problem:rate-limited"
        assert client.get("/v1/profiles", headers=SUBMIT).status_code == 200


@settings(max_examples=60, deadline=None)
@given(
    rate=st.floats(0.5, 50),
    burst=st.integers(1, 20),
    gaps=st.lists(st.floats(0, 2), min_size=1, max_size=80),
)
def test_a_bucket_never_allows_more_than_burst_plus_rate_times_elapsed(
    rate: float, burst: int, gaps: list[float]
) -> None:
    limiter = RateLimiter(rate_per_s=rate, burst=burst)
    now, allowed = 1000.0, 0
    for gap in gaps:
        now += gap
        wait = limiter.take("t", now=now)
        if wait > 0:  # Retry-After tells the truth: once it has passed, the request goes through
            assert wait <= 1 / rate + 1e-9
            now += wait + 1e-9
            assert limiter.take("t", now=now) == 0
        allowed += 1
    elapsed = now - 1000.0
    assert allowed <= burst + rate * elapsed + 1e-6


def test_the_client_sends_its_token_on_every_request() -> None:
    import httpx

    from skrull.api.client import PlanningClient

    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(202, json={"id": "p1", "status": "queued"})

    with PlanningClient("http://planner", token="worker-secret", transport=httpx.MockTransport(handler)) as client:
        client.submit(plan_request([[10]]))
    assert seen == ["Bearer worker-secret"]

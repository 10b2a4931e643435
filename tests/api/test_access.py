"""Access control: bearer tokens with submit and read-only roles (401/403 as problem+json), per-token rate
limits (429 with Retry-After), and the open API when no tokens are configured."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skrull.api.access import RateLimiter
from tests.api.conftest import LiveServer, plan_request, running_app

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
        scraped = client.get("/metrics", headers=READ).text
        assert scraped.count('skrull_submissions_total{outcome="created"} 1.0') == 1


def test_without_tokens_the_api_is_open(tmp_path: Path) -> None:
    with running_app(tmp_path / "skrull.db", solver_processes=0) as client:
        assert client.post("/v1/plans", json=plan_request([[10]])).status_code == 202


def test_a_token_over_its_rate_gets_429_with_retry_after_and_others_are_unaffected(tmp_path: Path) -> None:
    with running_app(
        tmp_path / "skrull.db",
        solver_processes=0,
        submit_tokens="submit-secret",
        read_tokens="worker-secret",
        rate_limit_per_s=0.05,  # a token per 20 s: the five requests surely come faster, under any load
        rate_limit_burst=3,
    ) as client:
        start = time.monotonic()
        answers = [client.get("/v1/profiles", headers=READ) for _ in range(5)]
        took = time.monotonic() - start
        assert [r.status_code for r in answers] == [200, 200, 200, 429, 429]
        limited = answers[3]
        assert limited.headers["content-type"] == PROBLEM
        # (1 - tokens refilled since the first request) / 0.05 per s, in whole seconds: 20 on a fast machine
        assert 20 - took <= int(limited.headers["retry-after"]) <= 20
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


# -- promises of a service with tokens, against a real server ---------------------------------------------

LIVE_TOKENS = {"SKRULL_SUBMIT_TOKENS": "submit-secret", "SKRULL_READ_TOKENS": "worker-secret"}


def _solved_plan(client: httpx.Client) -> str:
    r = client.post("/v1/plans", json=plan_request([[10, 20, 150]], dp=1, cp=2), headers=SUBMIT)
    plan_id: str = r.json()["id"]
    assert client.get(f"/v1/plans/{plan_id}", params={"wait": 20, "until": "final"}, headers=READ).json()[
        "status"
    ] == "solved"
    return plan_id


def test_metrics_need_a_token_unless_opened(live_server_factory: Callable[..., LiveServer], tmp_path: Path) -> None:
    closed = live_server_factory(tmp_path / "a.db", solver_processes=0, env=LIVE_TOKENS).start()
    opened = live_server_factory(
        tmp_path / "b.db", solver_processes=0, env={**LIVE_TOKENS, "SKRULL_METRICS_OPEN": "1"}
    ).start()
    assert httpx.get(f"{closed.url}/metrics").status_code == 401
    assert httpx.get(f"{closed.url}/metrics", headers=READ).status_code == 200
    assert httpx.get(f"{opened.url}/metrics").status_code == 200
    assert httpx.get(f"{closed.url}/healthz").status_code == 200  # probes need no token


@pytest.fixture(scope="module")
def server_with_tokens(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One server with tokens for the tests that only read what they planned."""
    server = LiveServer(tmp_path_factory.mktemp("access") / "s.db", solver_processes=1, env=LIVE_TOKENS)
    try:
        yield server.start()
    finally:
        server.close()


def test_head_is_answered_wherever_get_is(server_with_tokens: LiveServer) -> None:
    with httpx.Client(base_url=server_with_tokens.url, timeout=30) as client:
        plan_id = _solved_plan(client)
        for path in (
            f"/v1/plans/{plan_id}",
            f"/v1/plans/{plan_id}/ranks/1?iteration=0",
            f"/v1/plans/{plan_id}/timeline.svg?iteration=0",
            "/v1/profiles",
            "/healthz",
            "/metrics",
            "/openapi.json",
        ):
            get = client.get(path, headers=READ)
            head = client.head(path, headers=READ)
            assert (head.status_code, head.content) == (get.status_code, b""), path
            assert head.headers["content-type"] == get.headers["content-type"], path
        assert client.head("/v1/plans/nope", headers=READ).status_code == 404
        assert client.head("/v1/profiles").status_code == 401


def test_authenticated_answers_are_never_kept_by_shared_caches(server_with_tokens: LiveServer) -> None:
    with httpx.Client(base_url=server_with_tokens.url, timeout=30) as client:
        plan_id = _solved_plan(client)
        view = client.get(f"/v1/plans/{plan_id}/ranks/1?iteration=0", headers=READ)
        for r in (
            view,
            client.get(f"/v1/plans/{plan_id}/timeline.svg?iteration=0", headers=READ),
            client.get(f"/v1/plans/{plan_id}", headers=READ),
            client.get("/v1/profiles", headers=READ),
            client.get("/v1/profiles"),  # a refusal too
        ):
            assert r.headers["cache-control"] == "private, no-store", r.url
        # the client's own copy still revalidates
        again = client.get(
            f"/v1/plans/{plan_id}/ranks/1?iteration=0", headers={**READ, "If-None-Match": view.headers["etag"]}
        )
        assert again.status_code == 304


def test_failed_authentication_is_rate_limited_per_address(
    live_server_factory: Callable[..., LiveServer], tmp_path: Path
) -> None:
    # A failure refills in 5 s: the guesses below come faster than that under any load.
    env = {**LIVE_TOKENS, "SKRULL_AUTH_FAILURE_BURST": "5", "SKRULL_AUTH_FAILURES_PER_S": "0.2"}
    server = live_server_factory(tmp_path / "s.db", solver_processes=0, env=env).start()
    with httpx.Client(base_url=server.url, timeout=30) as client:
        guesses = [client.get("/v1/profiles", headers={"Authorization": f"Bearer guess-{k}"}) for k in range(8)]
        assert [r.status_code for r in guesses] == [401] * 5 + [429] * 3
        assert int(guesses[-1].headers["retry-after"]) >= 1
        # once the address is over its failures, even the right token waits: guessing gains nothing
        waiting = client.get("/v1/profiles", headers=READ)
        assert waiting.status_code == 429
        time.sleep(int(waiting.headers["retry-after"]) + 0.1)  # one failure refilled at 0.2/s: Retry-After says when
        assert client.get("/v1/profiles", headers=READ).status_code == 200

"""The worker-side client: submit/wait/rank_view against a real server, ETag caching, prefetching,
timeouts, and retries with backoff and jitter."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from skrull.api.client import PlanFailedError, PlanningClient, ServiceError, ServiceUnreachableError
from skrull.solver.io import request_from_dict
from skrull.solver.validate import plan_problems
from tests.api.conftest import LiveServer, free_port, plan_request
from tests.api.coverage import assert_views_cover_every_token_once


class RecordingTransport(httpx.HTTPTransport):
    """Real HTTP, remembering every request and response status."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        with self.lock:
            self.seen.append((str(request.url), response.status_code))
        return response


def test_submit_wait_and_rank_views(live_server: LiveServer) -> None:
    doc = plan_request([[150, 30, 99], [7, 200]], dp=2, cp=2)
    with PlanningClient(live_server.url) as client:
        plan_id = client.submit(doc)
        assert client.submit(doc) == plan_id
        plan = client.plan(plan_id)
        assert plan_problems(plan, request_from_dict(doc)) == []
        views = [client.rank_view(plan_id, rank, it) for it in range(2) for rank in range(4)]
    assert_views_cover_every_token_once(views, [150, 30, 99, 7, 200])


def test_rank_views_are_cached_by_etag(live_server: LiveServer) -> None:
    transport = RecordingTransport()
    with PlanningClient(live_server.url, transport=transport) as client:
        plan_id = client.submit(plan_request([[40, 41, 42]]))
        client.wait(plan_id)
        first = client.rank_view(plan_id, 2, 0)
        second = client.rank_view(plan_id, 2, 0)
    assert second == first
    rank_answers = [status for url, status in transport.seen if "/ranks/2" in url]
    assert rank_answers == [200, 304]


def test_the_iterator_fetches_the_next_iteration_while_the_current_one_runs(live_server: LiveServer) -> None:
    transport = RecordingTransport()
    doc = plan_request([[10, 20], [30], [40, 50], [60]], solver="test-slow", seed=9)
    with PlanningClient(live_server.url, transport=transport) as client:
        plan_id = client.submit(doc)
        got = []
        for view in client.iter_rank_views(plan_id, rank=1):
            got.append(view["iteration"])
            nxt = view["iteration"] + 1
            if nxt < 4:
                # "Run" iteration i until the request for i+1 has been answered: it was fetched meanwhile.
                deadline = time.monotonic() + 20
                while not any(f"iteration={nxt}" in url and status == 200 for url, status in list(transport.seen)):
                    assert time.monotonic() < deadline, "iteration i+1 was not fetched while i ran"
                    time.sleep(0.01)
    assert got == [0, 1, 2, 3]


def test_service_errors_name_the_field(live_server: LiveServer) -> None:
    with PlanningClient(live_server.url) as client:
        with pytest.raises(ServiceError) as bad:
            client.submit(plan_request([[10, 0]]))
        assert bad.value.status == 422 and bad.value.field == "batches[0][1]"
        plan_id = client.submit(plan_request([[10]]))
        client.wait(plan_id)
        with pytest.raises(ServiceError) as unknown:
            client.rank_view(plan_id, 4, 0)
        assert unknown.value.status == 404 and "must be in 0..3" in str(unknown.value)


def test_a_failed_plan_raises_plan_failed(live_server: LiveServer) -> None:
    with PlanningClient(live_server.url) as client:
        plan_id = client.submit(plan_request([[10, 20]], solver="test-infeasible"))
        with pytest.raises(PlanFailedError, match="refuses 2 sequences"):
            client.wait(plan_id)
        with pytest.raises(PlanFailedError):
            client.rank_view(plan_id, 0, 0)


def test_waiting_past_the_timeout_raises_timeout_error(live_server: LiveServer) -> None:
    # test-stalls holds the batch of 13 tokens (iteration 1) for minutes: the plan can never be ready in time.
    with PlanningClient(live_server.url) as client:
        plan_id = client.submit(plan_request([[11, 12], [13]], solver="test-stalls", seed=77))
        try:
            with pytest.raises(TimeoutError):
                client.rank_view(plan_id, 0, 1, timeout_s=0.05)
            with pytest.raises(TimeoutError):
                client.wait(plan_id, timeout_s=0.05)
        finally:  # frees the solver process for the module's other tests (the solve stops with its lease)
            httpx.delete(f"{live_server.url}/v1/plans/{plan_id}")


def test_connection_errors_are_retried_then_raised_naming_the_address() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    client = PlanningClient(url, retries=3, backoff_s=0.001, timeout_s=1.0)
    with pytest.raises(ServiceUnreachableError) as caught:
        client.get("abc")
    assert client.retried == 3
    assert url in str(caught.value) and "4 attempt(s)" in str(caught.value)
    assert isinstance(caught.value, ConnectionError) and isinstance(caught.value.__cause__, httpx.ConnectError)


def test_unavailable_answers_are_retried_with_jittered_backoff_honouring_retry_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers = [503, 503, 429, 202]
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        status = answers[len(calls) - 1]
        if status == 202:
            return httpx.Response(202, json={"id": "p1", "status": "queued"})
        return httpx.Response(status, headers={"Retry-After": "0.2"} if status == 429 else {})

    sleeps: list[float] = []
    monkeypatch.setattr("skrull.api.client.time.sleep", sleeps.append)
    client = PlanningClient("http://planner", transport=httpx.MockTransport(handler), backoff_s=0.1, seed=1)
    assert client.submit(plan_request([[1]])) == "p1"
    assert calls == ["POST"] * 4
    assert 0 <= sleeps[0] <= 0.1 and 0 <= sleeps[1] <= 0.2 and sleeps[2] >= 0.2
    assert len(set(sleeps)) == 3  # jittered, not lockstep


def test_retries_give_up_after_the_last_attempt() -> None:
    client = PlanningClient(
        "http://planner",
        retries=2,
        backoff_s=0.0,
        transport=httpx.MockTransport(lambda r: httpx.Response(503, json={"title": "down", "detail": "busy"})),
    )
    with pytest.raises(ServiceError, match="503: busy"):
        client.get("x")
    assert client.retried == 2


def test_accepts_a_solver_request_object(live_server: LiveServer) -> None:
    request = request_from_dict(plan_request([[60, 61]]))
    with PlanningClient(live_server.url) as client:
        envelope: dict[str, Any] = client.submit_and_wait(request)
    assert envelope["status"] == "solved" and envelope["num_sequences"] == 2

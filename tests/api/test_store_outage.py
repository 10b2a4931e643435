"""The database goes away under a running service and comes back: every route answers 503
``store-unavailable`` problem+json with ``Retry-After`` meanwhile (never a 500, never a dropped
connection), and afterwards the same server answers every request and solves again, with no restart
(its pooled connections, cut by the outage, are checked and replaced).

The outage is real: the service reaches its own PostgreSQL database through a TCP proxy on 127.0.0.1 that
the test cuts (every connection closed, new ones refused) and restores; the shared server is untouched."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.api.conftest import HAND_PROFILE, LiveServer, plan_request
from tests.api.pg import ADMIN_URL
from tests.api.tcp_proxy import TcpProxy

#: A hang detector for the recovery, not a timing promise.
RECOVERY_LIMIT_S = 120.0


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    import psycopg

    info = psycopg.conninfo.conninfo_to_dict(ADMIN_URL)
    proxy = TcpProxy(str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432)).start()
    yield proxy
    proxy.close()


def _through(url: str, proxy: TcpProxy) -> str:
    import psycopg

    info = psycopg.conninfo.conninfo_to_dict(url)
    user = info.get("user", "postgres")
    return f"postgresql://{user}@127.0.0.1:{proxy.port}/{info['dbname']}"


def _probes(plan_id: str) -> list[tuple[str, str, dict[str, Any] | None]]:
    upload = {**HAND_PROFILE, "name": "lab/outage"}
    return [
        ("POST", "/v1/plans", plan_request([[11, 12]])),
        ("GET", f"/v1/plans/{plan_id}", None),
        ("GET", f"/v1/plans/{plan_id}?wait=1", None),
        ("GET", f"/v1/plans/{plan_id}/ranks/0?iteration=0", None),
        ("GET", f"/v1/plans/{plan_id}/ranks/1?iteration=0&wait=1", None),
        ("GET", f"/v1/plans/{plan_id}/timeline.svg", None),
        ("GET", f"/v1/plans/{plan_id}/view", None),
        ("GET", "/v1/profiles", None),
        ("GET", "/v1/profiles/lab/none", None),
        ("POST", "/v1/profiles", upload),
        ("POST", "/v1/plans", {**plan_request([[5]]), "profile": "lab/none"}),
        ("DELETE", "/v1/plans/does-not-exist", None),
        ("GET", "/metrics", None),
        ("POST", "/v1/compare", {**plan_request([[7, 8]]), "solvers": ["round-robin"]}),
        ("GET", "/healthz", None),
    ]


def _ask(url: str, probe: tuple[str, str, dict[str, Any] | None]) -> httpx.Response:
    method, path, body = probe
    return httpx.request(method, f"{url}{path}", json=body, timeout=60)


def test_every_route_answers_503_through_an_outage_and_the_service_recovers_without_a_restart(
    live_server_factory: Callable[..., LiveServer], pg_db: str, proxy: TcpProxy
) -> None:
    server = live_server_factory(_through(pg_db, proxy), solver_processes=1).start()
    plan_id = httpx.post(f"{server.url}/v1/plans", json=plan_request([[10, 20]]), timeout=60).json()["id"]
    envelope = httpx.get(f"{server.url}/v1/plans/{plan_id}?wait=60&until=final", timeout=120).json()
    assert envelope["status"] == "solved"
    httpx.get(f"{server.url}/v1/plans/{plan_id}/ranks/0?iteration=0", timeout=60)  # now cached on the server

    proxy.cut()
    probes = _probes(plan_id)
    with ThreadPoolExecutor(len(probes)) as pool:
        answers = list(pool.map(lambda p: _ask(server.url, p), probes))  # a dropped connection raises here
    for (method, path, _), answer in zip(probes, answers, strict=True):
        what = f"{method} {path}: {answer.status_code} {answer.text[:300]}"
        assert answer.status_code < 500 or answer.status_code == 503, what
        if path == "/healthz":
            assert answer.status_code == 503 and answer.json()["store"].startswith("error"), what
        elif answer.status_code == 503:
            assert answer.headers["content-type"].startswith("application/problem+json"), what
            assert answer.json()["type"] == "urn:skrull:problem:store-unavailable", what
            assert int(answer.headers["retry-after"]) >= 1, what
    assert sum(a.status_code == 503 for a in answers) >= len(probes) - 2  # only a cached answer may be served

    proxy.restore()
    deadline = time.monotonic() + RECOVERY_LIMIT_S
    while httpx.get(f"{server.url}/healthz", timeout=60).status_code != 200:
        assert time.monotonic() < deadline, "the service did not recover"
        time.sleep(0.2)
    statuses = [httpx.get(f"{server.url}/v1/plans/{plan_id}", timeout=60).status_code for _ in range(60)]
    assert statuses == [200] * 60  # no stale pooled connection is handed out
    fresh = httpx.post(f"{server.url}/v1/plans", json=plan_request([[30, 40]]), timeout=60).json()["id"]
    envelope = httpx.get(f"{server.url}/v1/plans/{fresh}?wait=60&until=final", timeout=120).json()
    assert envelope["status"] == "solved"

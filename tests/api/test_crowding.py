"""Tenants crowding one real server (``skrull serve`` on 127.0.0.1): every global bound has per-tenant
shares, so one tenant's load never takes another's first request.

* A short job of one tenant is solved while another tenant's long solve holds the only general solver
  process (a solver process is kept for short work).
* One tenant may hold only its share of the shared queue: another tenant's first submission finds room.
* A tenant runs at most half of the compare processes: another tenant's compare starts at once; compares
  count in the tenant's solver seconds.
* A tenant's long-polls past its share are refused (429, Retry-After); another tenant's are not.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.api.conftest import LiveServer, plan_request


def gate(marker_dir: Path, lengths: list[int]) -> Path:
    """``tests.api.plugin_planners.gate``, imported here: that module registers the test planners on import,
    which must not happen at collection (tests/api/conftest.py)."""
    from tests.api.plugin_planners import gate as plugin_gate

    return plugin_gate(marker_dir, lengths)

TOKENS = {"team-a": "tokA", "team-b": "tokB"}
ENV = {"SKRULL_SUBMIT_TOKENS": ",".join(f"{t}={k}" for t, k in TOKENS.items()), "SKRULL_METRICS_OPEN": "1"}
#: A hang detector, never a timing promise (bench/siege.py measures how long).
LIMIT_S = 180.0


def auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[tenant]}"}


def submit(server: LiveServer, tenant: str, doc: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/plans", json=doc, headers=auth(tenant), timeout=60)


def status(server: LiveServer, tenant: str, plan_id: str) -> str:
    return str(httpx.get(f"{server.url}/v1/plans/{plan_id}", headers=auth(tenant), timeout=60).json()["status"])


def test_a_short_job_is_solved_while_another_tenant_s_long_solve_holds_the_solver(
    live_server_factory: Callable[..., LiveServer], tmp_path: Path
) -> None:
    env = {**ENV, "SKRULL_SHORT_SOLVER_PROCESSES": "1", "SKRULL_TEST_MARKER_DIR": str(tmp_path)}
    server = live_server_factory(tmp_path / "s.db", solver_processes=1, env=env).start()
    long_id = submit(server, "team-b", plan_request([[10]], solver="test-gated", time_budget_s=300.0)).json()["id"]
    deadline = time.monotonic() + LIMIT_S
    while status(server, "team-b", long_id) != "solving":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    short_id = submit(server, "team-a", plan_request([[20, 30]], time_budget_s=1.0)).json()["id"]
    envelope = httpx.get(
        f"{server.url}/v1/plans/{short_id}?wait=60&until=final", headers=auth("team-a"), timeout=120
    ).json()
    assert envelope["status"] == "solved"
    assert status(server, "team-b", long_id) == "solving"  # the long solve still holds the general process
    gate(tmp_path, [10]).touch()


def test_one_tenant_cannot_fill_the_shared_queue(
    live_server_factory: Callable[..., LiveServer], tmp_path: Path
) -> None:
    env = {**ENV, "SKRULL_MAX_QUEUED_JOBS": "10"}
    server = live_server_factory(tmp_path / "s.db", solver_processes=0, env=env).start()
    answers = [submit(server, "team-a", plan_request([[n + 1]])) for n in range(25)]
    codes = [a.status_code for a in answers]
    assert codes.count(202) == 5 and codes.count(429) == 20, codes  # half the queue (SKRULL_TENANT_QUEUE_SHARE)
    refusal = next(a for a in answers if a.status_code == 429)
    assert refusal.json()["type"] == "urn:skrull:problem:quota-exceeded" and refusal.headers["retry-after"]
    assert submit(server, "team-b", plan_request([[7]])).status_code == 202


def test_compares_share_their_processes_and_count_in_the_solver_seconds(
    live_server_factory: Callable[..., LiveServer], tmp_path: Path
) -> None:
    env = {**ENV, "SKRULL_TEST_SLEEP_S": "600", "SKRULL_TENANT_MAX_SOLVER_S": "300", "SKRULL_MAX_QUEUED_COMPARES": "4"}
    server = live_server_factory(tmp_path / "s.db", solver_processes=0, env=env).start()
    # 60 s budgets: a compare deadline (hard limit x planners) far past the test
    slow = {**plan_request([[10, 20]], time_budget_s=60.0), "solvers": ["test-slow"]}
    held: list[httpx.Response | BaseException] = []

    def compare_slowly() -> None:
        try:
            held.append(httpx.post(f"{server.url}/v1/compare", json=slow, headers=auth("team-a"), timeout=300))
        except BaseException as exc:
            held.append(exc)

    threads = [threading.Thread(target=compare_slowly) for _ in range(2)]
    for t in threads:
        t.start()
    quick = {**plan_request([[10, 20]], time_budget_s=1.0), "solvers": ["round-robin"]}
    answer = httpx.post(f"{server.url}/v1/compare", json=quick, headers=auth("team-b"), timeout=LIMIT_S)
    assert answer.status_code == 200, answer.text  # while team-a's compares run and wait
    assert not held, "team-a's compares of a planner sleeping 600 s cannot have ended"
    # team-b holds 290 solver seconds in the queue: a compare of 2 planners x 10 s would pass its 300
    assert submit(server, "team-b", plan_request([[5]], time_budget_s=290.0)).status_code == 202
    costly = {**plan_request([[10, 20]], time_budget_s=10.0), "solvers": ["round-robin"]}
    refused = httpx.post(f"{server.url}/v1/compare", json=costly, headers=auth("team-b"), timeout=LIMIT_S)
    assert refused.status_code == 429 and refused.json()["type"] == "urn:skrull:problem:quota-exceeded"
    assert "compares" in refused.json()["detail"]
    server.stop(timeout_s=LIMIT_S)
    for t in threads:
        t.join(timeout=LIMIT_S)
    assert all(isinstance(a, httpx.Response) and a.status_code == 503 for a in held), held


def test_long_polls_past_a_tenant_s_share_are_refused_and_others_still_wait(
    live_server_factory: Callable[..., LiveServer], tmp_path: Path
) -> None:
    env = {**ENV, "SKRULL_TENANT_MAX_LONG_POLLS": "3"}
    server = live_server_factory(tmp_path / "s.db", solver_processes=0, env=env).start()
    a_plan = submit(server, "team-a", plan_request([[10]])).json()["id"]
    b_plan = submit(server, "team-b", plan_request([[10]])).json()["id"]
    threads = [
        threading.Thread(
            target=httpx.get,
            args=(f"{server.url}/v1/plans/{a_plan}?wait=30",),
            kwargs={"headers": auth("team-a"), "timeout": 120},
        )
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + LIMIT_S
    while "skrull_long_polls_waiting 3.0" not in httpx.get(f"{server.url}/metrics", timeout=60).text:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    refused = httpx.get(f"{server.url}/v1/plans/{a_plan}?wait=30", headers=auth("team-a"), timeout=60)
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert refused.json()["field"] == "wait"
    assert httpx.get(f"{server.url}/v1/plans/{a_plan}", headers=auth("team-a"), timeout=60).status_code == 200
    other = httpx.get(f"{server.url}/v1/plans/{b_plan}?wait=0.5", headers=auth("team-b"), timeout=60)
    assert other.status_code == 200 and other.json()["status"] == "queued"
    server.stop(timeout_s=LIMIT_S)
    for t in threads:
        t.join(timeout=LIMIT_S)

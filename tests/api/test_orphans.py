"""A solver orphaned by a SIGKILL of its server stops within its lease and never writes: a real server is
killed alone (its solver process survives it), the orphan must exit within the lease, and a new server on
the same store takes the job back and solves it. On SQLite and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.api.conftest import LiveServer, plan_request, running

LEASE_S = 2.0


def test_an_orphaned_solver_stops_within_its_lease_and_the_job_is_solved_elsewhere(
    live_server_factory: Callable[..., LiveServer], store_location: str, tmp_path: Path
) -> None:
    env = {"SKRULL_LEASE_S": str(LEASE_S), "SKRULL_TEST_SLEEP_S": "60", "SKRULL_TEST_MARKER_DIR": str(tmp_path)}
    first = live_server_factory(store_location, solver_processes=1, env=env).start()
    doc = plan_request([[10, 20, 30]], dp=1, cp=2, solver="test-slow")
    plan_id = httpx.post(f"{first.url}/v1/plans", json=doc).json()["id"]
    deadline = time.monotonic() + 20
    while httpx.get(f"{first.url}/v1/plans/{plan_id}").json()["status"] != "solving":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    solvers = first.solver_pids()
    assert solvers
    first.kill(children_too=False)  # the server alone: its solver is now an orphan, mid-solve
    killed_at = time.monotonic()
    while any(running(pid) for pid in solvers):
        # it sleeps 60 s: gone well before means its lease ended it, whatever the machine's load
        assert time.monotonic() - killed_at < LEASE_S + 20.0, "the orphan outlived its lease"
        time.sleep(0.05)

    second = live_server_factory(store_location, solver_processes=1, env={**env, "SKRULL_TEST_SLEEP_S": "0.1"})
    second.start()
    final = httpx.get(f"{second.url}/v1/plans/{plan_id}", params={"wait": 30, "until": "final"}, timeout=40).json()
    assert final["status"] == "solved"
    assert final["plan"]["solver"] == "test-slow"

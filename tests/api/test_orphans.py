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


def _solve_children(server: LiveServer) -> list[int]:
    """The processes solver processes forked (an exact solve's child)."""
    from tests.api.conftest import _children

    return [child for solver in server.solver_pids() for child in _children(solver)]


def _start_forked_solve(server: LiveServer) -> tuple[str, list[int]]:
    doc = plan_request([[10, 20, 30]], dp=1, cp=2, solver="test-forked", time_budget_s=100)
    plan_id = httpx.post(f"{server.url}/v1/plans", json=doc).json()["id"]
    deadline = time.monotonic() + 30
    children: list[int] = []
    while not children:
        assert time.monotonic() < deadline, "the solve never forked"
        time.sleep(0.1)
        children = _solve_children(server)
    return plan_id, children


def test_deleting_a_plan_mid_solve_stops_its_solve_and_the_solves_child(
    live_server_factory: Callable[..., LiveServer], tmp_path: Path
) -> None:
    """Before: the deleted plan's solve ran on to its budget, its forked child at 80-100% CPU."""
    env = {"SKRULL_LEASE_S": str(LEASE_S), "SKRULL_TEST_SLEEP_S": "60"}
    server = live_server_factory(tmp_path / "skrull.db", solver_processes=1, env=env).start()
    plan_id, children = _start_forked_solve(server)
    assert httpx.delete(f"{server.url}/v1/plans/{plan_id}").status_code == 204
    deleted_at = time.monotonic()
    while any(running(pid) for pid in children):
        assert time.monotonic() - deleted_at < LEASE_S + 25.0, "the deleted plan's solve child runs on"
        time.sleep(0.05)
    # the server goes on solving
    quick = httpx.post(f"{server.url}/v1/plans", json=plan_request([[10, 20]], dp=1, cp=2)).json()["id"]
    final = httpx.get(f"{server.url}/v1/plans/{quick}", params={"wait": 30, "until": "final"}, timeout=40).json()
    assert final["status"] == "solved"


def test_a_killed_servers_solve_child_does_not_outlive_its_solver(
    live_server_factory: Callable[..., LiveServer], tmp_path: Path
) -> None:
    """Before: the SIGKILLed server's solver exited within its lease, its forked child ran on for 30 s."""
    env = {"SKRULL_LEASE_S": str(LEASE_S), "SKRULL_TEST_SLEEP_S": "60"}
    server = live_server_factory(tmp_path / "skrull.db", solver_processes=1, env=env).start()
    _, children = _start_forked_solve(server)
    server.kill(children_too=False)
    killed_at = time.monotonic()
    while any(running(pid) for pid in children):
        assert time.monotonic() - killed_at < LEASE_S + 25.0, "the solve's child outlived its solver"
        time.sleep(0.05)

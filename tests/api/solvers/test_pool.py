"""Solver processes: a job whose process dies is retried once or failed with the reason, never left
solving; a solve past its hard limit is stopped; the pool replaces dead processes."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from skrull.api.solvers.pool import describe_exit
from skrull.solver.io import plan_from_dict, request_from_dict
from skrull.solver.validate import plan_problems
from tests.api.conftest import plan_request, running_app


def finish(client: TestClient, plan_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        envelope = client.get(f"/v1/plans/{plan_id}", params={"wait": 5}).json()
        assert envelope["status"] in ("queued", "solving", "solved", "failed")
        if envelope["status"] in ("solved", "failed"):
            return envelope
    raise AssertionError(f"plan {plan_id} still {envelope['status']} after {timeout_s} s")


def alive_after_restart(client: TestClient, timeout_s: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        health = client.get("/healthz").json()
        if health["status"] == "ok":
            return health
        time.sleep(0.05)
    raise AssertionError(f"no solver process came back: {health}")


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("SKRULL_TEST_MARKER_DIR", str(tmp_path))
    with running_app(tmp_path / "skrull.db") as client:
        yield client


def test_a_job_whose_process_is_killed_every_time_fails_with_the_signal_after_one_retry(app: TestClient) -> None:
    plan_id = app.post("/v1/plans", json=plan_request([[10, 20]], solver="test-crash")).json()["id"]
    envelope = finish(app, plan_id)
    assert envelope["status"] == "failed" and envelope["attempts"] == 2
    assert envelope["error"]["type"] == "urn:skrull:problem:solver-died"
    assert "was killed by signal SIGKILL" in envelope["error"]["detail"]
    assert alive_after_restart(app)["solver_processes"]["alive"] == 1
    metrics = app.get("/metrics").text
    assert "skrull_jobs_retried_total 1.0" in metrics
    assert "skrull_solver_restarts_total 2.0" in metrics


def test_a_job_whose_process_dies_once_is_retried_and_solved(app: TestClient) -> None:
    doc = plan_request([[10, 20], [30]], solver="test-crash-once")
    plan_id = app.post("/v1/plans", json=doc).json()["id"]
    envelope = finish(app, plan_id)
    assert envelope["status"] == "solved" and envelope["attempts"] == 2
    assert "killed by signal SIGKILL" in envelope["last_error"]["detail"]
    assert plan_problems(plan_from_dict(envelope["plan"]), request_from_dict(doc)) == []


def test_jobs_queued_behind_a_dying_job_are_all_solved(app: TestClient) -> None:
    crash = app.post("/v1/plans", json=plan_request([[1, 2]], solver="test-crash")).json()["id"]
    others = [app.post("/v1/plans", json=plan_request([[k, 2 * k]])).json()["id"] for k in range(1, 6)]
    assert finish(app, crash)["status"] == "failed"
    assert [finish(app, p)["status"] for p in others] == ["solved"] * 5


def test_a_solve_past_its_hard_limit_is_stopped_and_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The third batch stalls far past the hard limit (0.1 s budget * 1 + 3 s grace); the two before it take
    milliseconds, so their publication does not race the limit on a loaded machine."""
    monkeypatch.setenv("SKRULL_TEST_SLEEP_S", "120")
    with running_app(tmp_path / "skrull.db", solve_timeout_factor=1.0, solve_timeout_grace_s=3.0) as client:
        doc = plan_request([[10], [20], [13], [40], [50]], solver="test-stalls", time_budget_s=0.1)
        envelope = finish(client, client.post("/v1/plans", json=doc).json()["id"])
        assert envelope["status"] == "failed" and envelope["error"]["type"] == "urn:skrull:problem:solve-timeout"
        assert "the hard limit of 3.1 s" in envelope["error"]["detail"]
        assert envelope["progress"]["iterations_solved"] == 2
        assert alive_after_restart(client)["status"] == "ok"
        assert finish(client, client.post("/v1/plans", json=plan_request([[5]])).json()["id"])["status"] == "solved"


def test_a_server_with_no_solver_processes_accepts_and_keeps_jobs_queued(tmp_path: Path) -> None:
    with running_app(tmp_path / "skrull.db", solver_processes=0) as client:
        plan_id = client.post("/v1/plans", json=plan_request([[5, 6]])).json()["id"]
        time.sleep(0.3)
        assert client.get(f"/v1/plans/{plan_id}").json()["status"] == "queued"
        assert client.get("/healthz").json()["solver_processes"] == {"configured": 0, "alive": 0}
    with running_app(tmp_path / "skrull.db") as client:
        assert finish(client, plan_id)["status"] == "solved"


def test_exit_descriptions_name_the_signal() -> None:
    assert describe_exit(-9) == "was killed by signal SIGKILL"
    assert describe_exit(3) == "exited with status 3"


def test_the_supervisor_survives_a_full_store_and_recovers_when_space_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A solver process dies while the store refuses writes ("database or disk is full"): the supervisor
    keeps running, replaces the process, and once the store takes writes again the dead process's job is
    queued again and solved; /healthz says so (before: the supervisor thread died in release(), leaving 0
    solvers, jobs queued forever and /healthz 503 until a restart)."""
    import signal
    import sqlite3

    from skrull.api.store.sqlite import SQLiteJobStore

    full = {"on": False}
    real_release = SQLiteJobStore.release

    def release(self, **kwargs):  # type: ignore[no-untyped-def]
        if full["on"]:
            raise sqlite3.OperationalError("database or disk is full")
        return real_release(self, **kwargs)

    monkeypatch.setattr(SQLiteJobStore, "release", release)
    monkeypatch.setenv("SKRULL_TEST_SLEEP_S", "30")
    with running_app(tmp_path / "skrull.db") as client:
        pool = client.app.state.service.pool  # type: ignore[attr-defined]
        slow = client.post("/v1/plans", json=plan_request([[10]], solver="test-slow", time_budget_s=60)).json()
        deadline = time.monotonic() + 30
        while client.get(f"/v1/plans/{slow['id']}").json()["status"] != "solving":
            assert time.monotonic() < deadline, "the job was never claimed"
            time.sleep(0.05)
        monkeypatch.setenv("SKRULL_TEST_SLEEP_S", "0.1")  # the replacement's solves are quick
        full["on"] = True
        os.kill(pool._slots[0].process.pid, signal.SIGKILL)
        time.sleep(1.0)  # a few supervision passes (0.1 s each) against the full store
        assert all(t.is_alive() for t in pool._threads), "the supervisor thread died"
        full["on"] = False
        health = alive_after_restart(client)
        assert health["solver_processes"]["alive"] >= 1
        envelope = finish(client, slow["id"], timeout_s=60)
        assert envelope["status"] == "solved" and envelope["attempts"] == 2
        quick = client.post("/v1/plans", json=plan_request([[20, 30]])).json()
        assert finish(client, quick["id"])["status"] == "solved"

"""``/metrics`` through ``prometheus_client``: a real ``skrull serve`` in multi-process mode, scraped over
HTTP and read with ``prometheus_client``'s own parser, and the in-process registry of an app built in tests."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from skrull.api.client import PlanningClient
from skrull.api.metrics import Metrics
from tests.api.conftest import LiveServer, plan_request
from tests.api.scrape import families, samples

#: The metric names the service has always exported; dashboards and alerts name them.
NAMES = {
    "skrull_solve_duration_seconds": "histogram",
    "skrull_http_request_duration_seconds": "histogram",
    "skrull_submissions": "counter",
    "skrull_plans_served": "counter",
    "skrull_errors": "counter",
    "skrull_jobs_retried": "counter",
    "skrull_jobs_failed": "counter",
    "skrull_solver_restarts": "counter",
    "skrull_plans_deleted": "counter",
    "skrull_queue_depth": "gauge",
    "skrull_jobs": "gauge",
    "skrull_solver_processes": "gauge",
    "skrull_long_polls_waiting": "gauge",
}


@pytest.fixture
def metrics_server(tmp_path: Path) -> Iterator[tuple[LiveServer, Path]]:
    scratch = tmp_path / "tmp"  # the server's TMPDIR: where its metrics directory is made
    scratch.mkdir()
    server = LiveServer(tmp_path / "skrull.db", solver_processes=1, env={"TMPDIR": str(scratch)}).start()
    yield server, scratch
    server.close()


def test_a_live_server_sums_its_solver_processes_metrics_and_removes_their_directory(
    metrics_server: tuple[LiveServer, Path],
) -> None:
    server, scratch = metrics_server
    (shared,) = scratch.glob("skrull-metrics-*")
    with PlanningClient(server.url) as client:
        plan_id = client.submit(plan_request([[77, 78, 120], [30]]))
        client.wait(plan_id, timeout_s=30)
        client.rank_view(plan_id, 0, 0)
    assert httpx.get(f"{server.url}/v1/plans/does-not-exist").status_code == 404
    scrape = httpx.get(f"{server.url}/metrics")
    assert scrape.status_code == 200 and scrape.headers["content-type"].startswith("text/plain")
    present = families(scrape.text)
    # families no process has touched yet (a labelled counter never incremented) are absent, as in any
    # multi-process exposition; every family present has its old name and type
    assert {name: NAMES.get(name) for name in present} == present
    assert set(NAMES) - set(present) <= {"skrull_jobs_failed", "skrull_plans_deleted"}
    got = samples(scrape.text)
    solved = (("solver", "skrull"), ("status", "solved"))
    assert got[("skrull_solve_duration_seconds_count", solved)] == 1
    assert got[("skrull_solve_duration_seconds_bucket", (("le", "+Inf"), *solved))] == 1
    assert got[("skrull_submissions_total", (("outcome", "created"),))] == 1
    assert got[("skrull_plans_served_total", (("kind", "plan"),))] >= 1
    assert got[("skrull_plans_served_total", (("kind", "rank_view"),))] == 1
    assert got[("skrull_errors_total", (("status", "404"), ("type", "unknown-plan")))] == 1
    assert got[("skrull_queue_depth", ())] == 0
    assert got[("skrull_jobs", (("status", "solved"),))] == 1
    assert got[("skrull_solver_processes", ())] == 1
    # the solve was recorded by the solver process itself, in its own file beside the server's
    histogram_files = sorted(p.name for p in shared.glob("histogram_*.db"))
    assert len(histogram_files) == 2, histogram_files
    assert f"histogram_{server.process.pid}.db" in histogram_files  # type: ignore[union-attr]
    server.close()
    assert not shared.exists()


def test_an_app_in_one_process_keeps_its_own_registry() -> None:
    first, second = Metrics(), Metrics()
    first.submissions.labels("created").inc()
    first.solve_seconds.labels("skrull", "solved").observe(0.3)
    got = samples(first.render(jobs_by_status={"queued": 2, "solved": 5}, solver_processes=3).decode())
    assert got[("skrull_submissions_total", (("outcome", "created"),))] == 1
    solved = (("solver", "skrull"), ("status", "solved"))
    assert got[("skrull_solve_duration_seconds_bucket", (("le", "0.25"), *solved))] == 0
    assert got[("skrull_solve_duration_seconds_bucket", (("le", "0.5"), *solved))] == 1
    assert got[("skrull_queue_depth", ())] == 2
    assert got[("skrull_jobs", (("status", "solving"),))] == 0
    assert got[("skrull_solver_processes", ())] == 3
    other = samples(second.render(jobs_by_status={}, solver_processes=0).decode())
    assert ("skrull_submissions_total", (("outcome", "created"),)) not in other


def test_solve_counts_survive_a_solver_process_that_died(metrics_server: tuple[LiveServer, Path]) -> None:
    server, scratch = metrics_server
    (shared,) = scratch.glob("skrull-metrics-*")
    assert server.process is not None
    with PlanningClient(server.url) as client:
        client.wait(client.submit(plan_request([[77, 78]])), timeout_s=30)
        (solver_file,) = [p for p in shared.glob("histogram_*.db") if p.name != f"histogram_{server.process.pid}.db"]
        os.kill(int(solver_file.stem.split("_")[1]), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while samples(httpx.get(f"{server.url}/metrics").text).get(("skrull_solver_restarts_total", ())) != 1:
            assert time.monotonic() < deadline, "the solver process was not replaced"
            time.sleep(0.1)
        client.wait(client.submit(plan_request([[90, 12]])), timeout_s=30)
    got = samples(httpx.get(f"{server.url}/metrics").text)
    assert got[("skrull_solve_duration_seconds_count", (("solver", "skrull"), ("status", "solved")))] == 2
    assert len(list(shared.glob("histogram_*.db"))) == 3  # the dead process's file is still summed

"""``skrull serve``: flags and environment reach the settings; mistakes are one line and exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from tests.api.conftest import LiveServer

ROOT = Path(__file__).resolve().parents[2]


def serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "skrull.cli.main", "serve", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def test_serve_runs_the_service_on_the_given_port_and_database(tmp_path: Path) -> None:
    server = LiveServer(tmp_path / "state" / "plans.db", solver_processes=1).start()
    try:
        health = httpx.get(f"{server.url}/healthz").json()
        assert health["status"] == "ok" and health["solver_processes"]["alive"] == 1
        assert (tmp_path / "state" / "plans.db").is_file()
    finally:
        server.stop()


def test_a_bad_flag_is_one_line_and_exit_2() -> None:
    out = serve("--port", "70000")
    assert out.returncode == 2
    assert out.stderr.strip() == "skrull: error: --port: 70000: Input should be less than or equal to 65535"


def test_a_bad_environment_variable_is_named() -> None:
    out = serve(env={"SKRULL_MAX_WAIT_S": "forever"})
    assert out.returncode == 2 and out.stderr.startswith("skrull: error: SKRULL_MAX_WAIT_S: 'forever': ")


def test_the_former_solvers_flag_warns_that_it_is_now_solver_processes() -> None:
    # --solvers is the planner list of `skrull compare`; on serve it used to be the process count
    out = serve("--solvers", "0", "--port", "70000")  # the bad port ends it before anything starts
    lines = out.stderr.strip().splitlines()
    assert "`skrull serve --solvers N` is now --solver-processes N" in lines[0]
    assert lines[-1].startswith("skrull: error: --port: 70000") and out.returncode == 2

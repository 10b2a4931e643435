"""Service fixtures: apps on a real SQLite file with real solver processes, and real uvicorn servers
(``skrull serve`` in a subprocess on 127.0.0.1 with a free port)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from skrull.api.app import create_app
from skrull.api.settings import Settings
from skrull.solver.planners import registry

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = "tests.api.plugin_planners"
#: How long a server or worker may take to come up before the test calls it hung: a process importing the
#: service took over 30 s with both cores busy (load 15), so this only tells a start from none.
START_TIMEOUT_S = 120.0

HAND_PROFILE: dict[str, Any] = {
    "name": "hand",
    "compute": {"flops_per_token": 1e9, "flops_per_token_sq": 1e5, "ms_per_tflop": 2.0, "fixed_ms": 0.5},
    "comm": {"bytes_per_token": 2**20, "ms_per_mib": 0.001, "fixed_ms": 0.2},
    "memory": {"bucket_tokens": 100},
    "microbatch_ms": 3.0,
}


@pytest.fixture(autouse=True, scope="module")
def test_planners_registered() -> Iterator[None]:
    """The test-only planners (some kill their process) are known while a service test module runs, and
    removed afterwards so that tests of "every planner" elsewhere never run them in the test process."""
    saved = dict(registry._REGISTRY)
    from tests.api import plugin_planners  # registers on first import, so import here, never at module level

    plugin_planners.register_all()
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)


def plan_request(
    batches: list[list[int]], *, dp: int = 2, cp: int = 2, solver: str = "skrull", **extra: Any
) -> dict[str, Any]:
    """A request document on the hand profile (bucket 100 tokens, so cp*bucket = 200 per sequence)."""
    return {"batches": batches, "parallel": {"dp": dp, "cp": cp}, "profile": HAND_PROFILE, "solver": solver, **extra}


def service_settings(db: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "db": db,
        "solver_processes": 1,
        "plugins": PLUGINS,
        "supervise_interval_s": 0.1,
        "idle_poll_s": 0.5,
        "short_solver_processes": 0,  # tests that count processes see the ones they asked for
        **overrides,
    }
    return Settings(**values)


@contextlib.contextmanager
def running_app(db: Path, **overrides: Any) -> Iterator[TestClient]:
    with TestClient(create_app(service_settings(db, **overrides))) as client:
        yield client


@pytest.fixture(scope="module")
def shared_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """One app (one solver process) shared by a test module: starting solver processes takes a moment."""
    marker_dir = tmp_path_factory.mktemp("markers")
    os.environ["SKRULL_TEST_MARKER_DIR"] = str(marker_dir)
    with running_app(tmp_path_factory.mktemp("store") / "skrull.db") as client:
        yield client


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class LiveServer:
    """``skrull serve`` as a subprocess: start, stop (SIGTERM, graceful), kill (SIGKILL)."""

    def __init__(
        self,
        db: Path | str,
        *,
        solver_processes: int = 1,
        env: dict[str, str] | None = None,
        log_dir: Path | None = None,
    ) -> None:
        self.db = db
        self.solver_processes = solver_processes
        self.env = env or {}
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.log = (log_dir or Path(db).parent) / f"server-{time.monotonic_ns()}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, timeout_s: float = START_TIMEOUT_S, port: int | None = None) -> LiveServer:
        self.port = port or free_port()
        env = {
            **os.environ,
            "SKRULL_PLUGINS": PLUGINS,
            "SKRULL_SUPERVISE_INTERVAL_S": "0.1",
            "SKRULL_SHORT_SOLVER_PROCESSES": "0",  # tests that count processes see the ones they asked for
            "PYTHONPATH": str(ROOT),
            **self.env,
        }
        cmd = [
            sys.executable,
            "-m",
            "skrull.cli.main",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--db",
            str(self.db),
            "--solver-processes",
            str(self.solver_processes),
            "--log-level",
            "warning",
        ]
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}: {self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"server did not answer within {timeout_s} s: {self.log.read_text()}")

    def stop(self, *, timeout_s: float = 20.0) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def solver_pids(self) -> list[int]:
        assert self.process is not None
        return _children(self.process.pid)

    def kill(self, *, children_too: bool = True) -> None:
        """SIGKILL the server, and with ``children_too`` its solver processes (the machine's crash)."""
        assert self.process is not None
        children = _children(self.process.pid) if children_too else []
        self.process.kill()
        self.process.wait()
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.stop()


class SolverWorker:
    """``skrull solver-worker`` as a subprocess on a shared store: start, stop (SIGTERM), kill (SIGKILL, with
    its solver processes: the machine's crash)."""

    def __init__(self, db: str, *, processes: int = 1, env: dict[str, str] | None = None, log_dir: Path) -> None:
        self.db, self.processes, self.env = db, processes, env or {}
        self.log = log_dir / f"worker-{time.monotonic_ns()}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *, timeout_s: float = START_TIMEOUT_S) -> SolverWorker:
        env = {
            **os.environ,
            "SKRULL_PLUGINS": PLUGINS,
            "SKRULL_SUPERVISE_INTERVAL_S": "0.1",
            "SKRULL_SHORT_SOLVER_PROCESSES": "0",
            "PYTHONPATH": str(ROOT),
            **self.env,
        }
        cmd = [
            sys.executable,
            "-m",
            "skrull.cli.main",
            "solver-worker",
            "--db",
            self.db,
            "--processes",
            str(self.processes),
        ]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while b"processes on" not in self.log.read_bytes():  # its start-up line: the pool is running
            if self.process.poll() is not None:
                raise RuntimeError(f"solver worker exited with {self.process.returncode}: {self.log.read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"solver worker did not start within {timeout_s} s: {self.log.read_text()}")
            time.sleep(0.05)
        return self

    def solver_pids(self) -> list[int]:
        assert self.process is not None
        return _children(self.process.pid)

    def kill(self) -> None:
        assert self.process is not None
        children = _children(self.process.pid)
        self.process.kill()
        self.process.wait()
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def stop(self, *, timeout_s: float = 20.0) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.stop()


@pytest.fixture
def solver_worker_factory(tmp_path: Path) -> Iterator[Any]:
    workers: list[SolverWorker] = []

    def make(db: str, **kwargs: Any) -> SolverWorker:
        worker = SolverWorker(db, log_dir=tmp_path, **kwargs)
        workers.append(worker)
        return worker

    yield make
    for worker in workers:
        worker.close()


@pytest.fixture
def pg_db() -> Iterator[str]:
    """A fresh PostgreSQL database's URL (skips when no server answers)."""
    from tests.api.pg import temporary_database

    with temporary_database() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def store_location(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The same service test on a SQLite file and on a PostgreSQL database."""
    if request.param == "sqlite":
        yield str(tmp_path / "skrull.db")
        return
    from tests.api.pg import temporary_database

    with temporary_database() as url:
        yield url


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False)
    return [int(x) for x in out.stdout.split()]


@pytest.fixture
def live_server_factory(tmp_path: Path) -> Iterator[Any]:
    servers: list[LiveServer] = []

    def make(db: Path | str | None = None, **kwargs: Any) -> LiveServer:
        kwargs.setdefault("log_dir", tmp_path)
        server = LiveServer(db or tmp_path / "skrull.db", **kwargs)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One real server shared by a test module (2 solver processes)."""
    root = tmp_path_factory.mktemp("live")
    server = LiveServer(root / "skrull.db", solver_processes=2, env={"SKRULL_TEST_MARKER_DIR": str(root)})
    server.start()
    yield server
    server.close()

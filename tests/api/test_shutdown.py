"""A normal shutdown: SIGTERM sent to the server and its solver processes together (what a service
manager's stop does to the process group) ends the service quietly, with no solver process reported dead."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.api.conftest import LiveServer, plan_request


def gate(marker_dir: Path, lengths: list[int]) -> Path:
    """``tests.api.plugin_planners.gate``, imported here: that module registers the test planners on import,
    which must not happen at collection (tests/api/conftest.py)."""
    from tests.api.plugin_planners import gate as plugin_gate

    return plugin_gate(marker_dir, lengths)


def _ignores_sigterm(pid: int) -> bool:
    """Whether the process has set SIGTERM to be ignored (``SigIgn`` in /proc: bit 15 - 1)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def test_sigterm_to_the_whole_group_is_a_quiet_shutdown(
    live_server_factory: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = live_server_factory(tmp_path / "s.db", solver_processes=2).start()
    assert server.process is not None
    solvers = server.solver_pids()
    assert solvers
    deadline = time.monotonic() + 120  # a hang detector: the processes import the planners first
    while not all(_ignores_sigterm(pid) for pid in solvers):
        assert time.monotonic() < deadline, "the solver processes never started"
        time.sleep(0.05)
    for pid in solvers:  # the solver processes first: the order in which a group signal may land
        os.kill(pid, signal.SIGTERM)
    time.sleep(0.5)  # time for the supervisor to see a death, had there been one
    # uvicorn ends by re-raising the signal it handled: the exit status says SIGTERM (a generous limit: a
    # hang detector, not a timing promise; a loaded machine shuts down slowly)
    server.stop(timeout_s=120)
    log = server.log.read_text()
    assert "killed by signal" not in log and "solver-died" not in log, log
    deadline = time.monotonic() + 60  # the server ended them on its way out; they may still be exiting
    while any(_running(pid) for pid in solvers):
        assert time.monotonic() < deadline, f"solver processes outlived the server: {solvers}"
        time.sleep(0.1)


def _running(pid: int) -> bool:
    """Alive and not a zombie (an exited child stays one until reaped)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def _waiting_long_polls(url: str) -> int:
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("skrull_long_polls_waiting "):
            return int(float(line.split()[1]))
    return 0


def test_sigterm_answers_every_waiting_long_poll_with_its_state_and_loses_nothing(
    live_server_factory: Callable[..., LiveServer], tmp_path: Path
) -> None:
    """Long-polls on a plan being solved (the envelope, until final, and a rank view of an iteration not yet
    solved) are open when SIGTERM arrives: each answers at once with the plan's current state (200 and 202
    with Retry-After), never a cancelled request's plain-text 500; the server exits on its own, and the
    job, queued again uncharged, is solved by the next server on the same store."""
    db = tmp_path / "s.db"
    env = {"SKRULL_TEST_SLEEP_S": "0.2", "SKRULL_TEST_MARKER_DIR": str(tmp_path)}
    server = live_server_factory(db, solver_processes=1, env=env).start()
    doc = plan_request([[10], [20]], solver="test-gated", time_budget_s=60.0)
    plan_id = httpx.post(f"{server.url}/v1/plans", json=doc, timeout=30).json()["id"]
    deadline = time.monotonic() + 120  # a hang detector
    while httpx.get(f"{server.url}/v1/plans/{plan_id}", timeout=30).json()["status"] != "solving":
        assert time.monotonic() < deadline, "the job was never claimed"
        time.sleep(0.05)
    answers: list[httpx.Response | BaseException] = []

    def poll(path: str) -> None:
        try:
            answers.append(httpx.get(f"{server.url}{path}", timeout=120))
        except BaseException as exc:
            answers.append(exc)

    paths = [f"/v1/plans/{plan_id}?wait=60&until=final"] * 3 + [f"/v1/plans/{plan_id}/ranks/0?iteration=1&wait=60"] * 3
    threads = [threading.Thread(target=poll, args=(p,)) for p in paths]
    for t in threads:
        t.start()
    while _waiting_long_polls(server.url) < len(paths):
        assert time.monotonic() < deadline, "the long-polls never started waiting"
        time.sleep(0.05)
    assert server.process is not None
    server.process.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(timeout=120)
    assert server.process.wait(timeout=120) is not None
    assert len(answers) == len(paths)
    for answer in answers:
        assert isinstance(answer, httpx.Response), answer
        assert answer.status_code in (200, 202), (answer.status_code, answer.text)
        body = answer.json()
        if answer.status_code == 202:
            assert answer.headers["retry-after"] and body["status"] in ("queued", "solving")
        else:
            assert body["id"] == plan_id and body["status"] in ("queued", "solving")
    gate(tmp_path, [10]).touch()
    gate(tmp_path, [20]).touch()
    again = live_server_factory(db, solver_processes=1, env=env).start()
    envelope = httpx.get(f"{again.url}/v1/plans/{plan_id}?wait=60&until=final", timeout=120).json()
    assert envelope["status"] == "solved" and envelope["attempts"] == 1  # the stopped attempt was not charged


def test_the_client_retries_a_stopping_server_s_503_on_idempotent_calls(
    live_server_factory: Callable[..., LiveServer], tmp_path: Path
) -> None:
    """A plan read whose server is stopping and then gone is retried (503 with Retry-After, then connection
    errors) until a server on the same store answers."""
    from skrull.api.client import PlanningClient

    db = tmp_path / "s.db"
    first = live_server_factory(db, solver_processes=1).start()
    port = first.port
    with PlanningClient(first.url, timeout_s=30, retries=400, backoff_s=0.05, max_backoff_s=1.0) as client:
        plan_id = client.submit(plan_request([[10, 20]]))
        first.stop(timeout_s=120)
        second = LiveServer(db, solver_processes=1, log_dir=tmp_path)
        restart = threading.Thread(target=lambda: _start_on(second, port))
        restart.start()
        envelope = client.wait(plan_id, timeout_s=240)
        restart.join()
        second.close()
        assert envelope["status"] == "solved" and client.retried > 0


def _start_on(server: LiveServer, port: int) -> None:
    server.start(port=port)

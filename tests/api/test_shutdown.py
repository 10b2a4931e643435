"""A normal shutdown: SIGTERM sent to the server and its solver processes together (what a service
manager's stop does to the process group) ends the service quietly, with no solver process reported dead."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from tests.api.conftest import LiveServer


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

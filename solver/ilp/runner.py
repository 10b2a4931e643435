"""Keep a wall-clock budget: run a solve in a child process, collect its incumbents, kill it if late.

Solvers honour their own time limits only approximately (model translation, presolve and a final LP can
overrun them). The child reports every improving solution over a pipe as it finds it; the parent waits
until the deadline plus a small grace, then kills the child and keeps the last report. So a request's
``time_budget_s`` holds for the whole solve and the answer is always the best incumbent seen.

"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: Seconds allowed past the deadline before the child is killed: at most this, and at most
#: ``GRACE_FRACTION`` of the time from the call to the deadline.
GRACE_S = 0.25
GRACE_FRACTION = 0.1

Report = Callable[[Any], None]
Work = Callable[[Report, float], Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOutcome:
    """``payload``: the final answer, or the last incumbent when ``killed``; None if nothing came."""

    payload: Any
    killed: bool
    error: str | None = None


def _child(work: Work, deadline: float, conn: multiprocessing.connection.Connection) -> None:
    def report(payload: Any) -> None:
        conn.send(("incumbent", payload))

    try:
        conn.send(("final", work(report, deadline)))
    except Exception as exc:  # sent to the parent, which decides what to do
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def run_with_deadline(work: Work, *, deadline: float, grace_s: float | None = None) -> RunOutcome:
    """Run ``work(report, deadline)`` in a forked child; ``deadline`` is a ``time.monotonic()`` value.

    The child is a plain ``os.fork`` (not a ``multiprocessing.Process``), so this also works inside
    daemonic worker processes such as the service's solver pool.
    """
    if grace_s is None:
        grace_s = min(GRACE_S, GRACE_FRACTION * max(0.0, deadline - time.monotonic()))
    return start_child(work, deadline=deadline).collect(deadline=deadline, grace_s=grace_s)


@dataclass(slots=True)
class Child:
    """A forked ``work`` running while the parent does something else; ``collect`` waits for it (and
    ``read`` takes what it has sent so far, leaving it running)."""

    pid: int
    receiver: multiprocessing.connection.Connection
    #: the last incumbent read, and the outcome once the child has answered (``read``)
    last: Any = None
    outcome: RunOutcome | None = None

    def read(self, *, until: float, on_report: Callable[[Any], None] | None = None) -> RunOutcome | None:
        """Read reports until ``until`` or the child's answer, without killing it; the outcome once it
        has answered, else None (it is still running). Every report is passed to ``on_report`` as it
        arrives; past ``until``, what the child already sent is still read (a caller that comes late,
        having worked meanwhile, gets every report made in time)."""
        receiver = self.receiver
        while self.outcome is None:
            if not receiver.poll(max(0.0, until - time.monotonic())):
                return None
            try:
                kind, value = receiver.recv()
            except EOFError:
                ended = "solver process ended without an answer"
                self.outcome = RunOutcome(payload=self.last, killed=False, error=ended)
                break
            if kind == "incumbent":
                self.last = value
                if on_report is not None:
                    on_report(value)
            elif kind == "final":
                self.outcome = RunOutcome(payload=value, killed=False)
            else:
                self.outcome = RunOutcome(payload=self.last, killed=False, error=str(value))
        return self.outcome

    def collect(self, *, deadline: float, grace_s: float, on_report: Callable[[Any], None] | None = None) -> RunOutcome:
        """Wait until ``deadline + grace_s`` for the answer (``read``), then kill the child (always); the
        last report is the payload of a killed child."""
        try:
            outcome = self.read(until=deadline + grace_s, on_report=on_report)
            return outcome if outcome is not None else RunOutcome(payload=self.last, killed=True)
        finally:
            self.receiver.close()
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)


#: prctl(2) option: the signal this process gets when the thread that forked it ends (Linux).
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> None:
    """In a forked child: be killed (SIGKILL) when the process that forked it ends, however it ends (a
    SIGKILLed solver process, a server stopped or killed, a solve abandoned when its plan was deleted), so no
    exact solve outlives the solve that asked for it. Linux only (``prctl(PR_SET_PDEATHSIG)``); elsewhere
    the child still ends at its deadline. A parent that died before the call is caught by ``getppid``."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:
        os._exit(0)


def start_child(work: Work, *, deadline: float) -> Child:
    """Fork a child running ``work(report, deadline)``; the caller must ``collect`` it."""
    receiver, sender = multiprocessing.Pipe(duplex=False)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: solve, report, and leave without running the parent's exit handlers
        _die_with_parent(parent)
        receiver.close()
        try:
            _child(work, deadline, sender)
        finally:
            os._exit(0)
    sender.close()
    return Child(pid=pid, receiver=receiver)

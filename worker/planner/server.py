"""The node's planner process: requests by content key, solved one at a time in submission order.

Started by the loader of local rank 0 (client.py's ``ProcessPlans``) as ``python -m
skrull.worker.planner.server``; the node's ranks submit requests and read their rank views over the Unix
socket (wire.py). It lives as long as the job: it exits when its parent's pipe closes, when a watched
launcher dies, or once every rank of the node has closed (worker/planner/__init__.py has the whole story).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skrull.solver.errors import RequestError
from skrull.solver.io import plan_to_dict, request_from_dict
from skrull.solver.planning import solve
from skrull.solver.types import Plan, Problem
from skrull.solver.worker_view import plan_rank_view
from skrull.worker.calibration import Calibration, RankTiming
from skrull.worker.plan_sources import plan_key
from skrull.worker.planner.wire import receive_message, send_message

log = logging.getLogger("skrull.planner")


# -- the planner process ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Entry:
    """One submitted request: solved in submission order by the solve thread."""

    doc: dict[str, Any]
    submitted_at: float
    order: int
    plan: Plan | None = None
    lengths: tuple[int, ...] = ()
    error: dict[str, Any] | None = None
    solved_at: float | None = None
    cpu_s: float = 0.0
    wall_s: float = 0.0
    first_view_at: float | None = None
    views: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)


def _error_doc(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, RequestError):
        try:
            value = json.loads(json.dumps(exc.value))
        except (TypeError, ValueError):
            value = repr(exc.value)[:200]
        return {"type": "RequestError", "field": exc.field, "value": value, "reason": exc.reason}
    return {"type": type(exc).__name__, "message": str(exc)[:2000]}


class Planner:
    """The planner process's state: requests by content key, solved one at a time in submission order."""

    def __init__(self) -> None:
        #: the run's measured microbatches and the profile refitted on them (worker/calibration.py)
        self.calibration: Calibration | None = None
        self._entries: dict[str, _Entry] = {}
        #: open connections, and the local ranks that ever asked; ``draining``: the owner's loader closed
        #: (or was dropped), exit once every local rank has come and gone (``_watch``)
        self.connections = 0
        self.ranks_seen: set[int] = set()
        self.draining = False
        self.draining_since = 0.0
        self._queue: deque[str] = deque()
        self._cv = threading.Condition()
        self._closed = False
        #: values the node's ranks agreed on (``agree``): the first proposal of a key is kept
        self._agreed: dict[str, str] = {}

    def agree(self, key: str, proposal: str) -> str:
        """The value of ``key``: ``proposal`` when this is the first proposal of the key, else the first one.
        The node's ranks agree through it on what must be the same everywhere (each request's budget) when
        they share no ``torch.distributed`` store (``ProcessPlans.compare_set``)."""
        with self._cv:
            return self._agreed.setdefault(key, proposal)

    def submit(self, doc: dict[str, Any], *, order: int = 0) -> str:
        """Queue ``doc`` (once per content key); the lowest ``order`` (the loader's request number) is solved
        first, whatever order the ranks' submissions arrive in."""
        key = plan_key(doc)
        with self._cv:
            if key in self._entries:
                return key
        request_from_dict(dict(doc))  # a bad request fails here, in the caller, naming the field
        with self._cv:
            if key not in self._entries:
                self._entries[key] = _Entry(doc=dict(doc), submitted_at=time.monotonic(), order=order)
                self._queue.append(key)
                self._cv.notify_all()
        return key

    def solve_forever(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                key = min(self._queue, key=lambda k: self._entries[k].order)
                self._queue.remove(key)
                entry = self._entries[key]
            wall0, cpu0 = time.perf_counter(), time.process_time()
            plan: Plan | None = None
            lengths: tuple[int, ...] = ()
            error = None
            try:
                request = request_from_dict(entry.doc)
                plan = solve(request)
                lengths = Problem.from_request(request).lengths
            except Exception as exc:  # reported to every rank that asks for this plan
                error = _error_doc(exc)
            with self._cv:
                entry.plan, entry.lengths, entry.error = plan, lengths, error
                entry.wall_s = time.perf_counter() - wall0
                entry.cpu_s = time.process_time() - cpu0
                entry.solved_at = time.monotonic()
                self._cv.notify_all()

    def _solved(self, key: str, timeout_s: float) -> _Entry:
        deadline = time.monotonic() + timeout_s
        with self._cv:
            entry = self._entries.get(key)
            if entry is None:
                raise KeyError(f"plan {key} was not submitted to this planner")
            if entry.first_view_at is None:
                entry.first_view_at = time.monotonic()
            while entry.solved_at is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"plan {key} not ready within {timeout_s} s")
                self._cv.wait(left)
            return entry

    def _meta(self, entry: _Entry) -> dict[str, Any]:
        return {
            "wall_s": entry.wall_s,
            "cpu_s": entry.cpu_s,
            "budget_s": entry.doc.get("time_budget_s"),
            "iterations": len(entry.doc.get("batches", ())),
        }

    def view(self, key: str, rank: int, iteration: int, timeout_s: float) -> dict[str, Any]:
        entry = self._solved(key, timeout_s)
        if entry.error is not None:
            return {"ok": False, "error": entry.error}
        assert entry.plan is not None
        view = entry.views.get((rank, iteration))
        if view is None:
            view = plan_rank_view(entry.plan, entry.lengths, iteration=iteration, rank=rank).to_dict(plan_id=key)
            entry.views[(rank, iteration)] = view
        return {"ok": True, "view": view, "solve": self._meta(entry)}

    def plan(self, key: str, timeout_s: float) -> dict[str, Any]:
        entry = self._solved(key, timeout_s)
        if entry.error is not None:
            return {"ok": False, "error": entry.error}
        assert entry.plan is not None
        return {"ok": True, "plan": plan_to_dict(entry.plan), "solve": self._meta(entry)}

    def stats(self) -> dict[str, Any]:
        """Per request: budget, wall and CPU seconds, when it was solved (``time.monotonic``, one clock for
        every process of the machine) and how long before a rank first asked for it it was ready
        (``lead_s``; negative: a prefetch thread asked before it was solved)."""
        with self._cv:
            rows = []
            for key, e in self._entries.items():
                lead = None
                if e.solved_at is not None and e.first_view_at is not None:
                    lead = e.first_view_at - e.solved_at
                rows.append(
                    {"key": key, **self._meta(e), "solved": e.solved_at is not None, "solved_at": e.solved_at,
                     "lead_s": lead}
                )  # fmt: skip
        return {"ok": True, "plans": rows, "process_cpu_s": time.process_time(), "pid": os.getpid()}

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()


def _handle(planner: Planner, conn: socket.socket) -> None:
    with planner._cv:
        planner.connections += 1
    try:
        _serve_connection(planner, conn)
    finally:
        with planner._cv:
            planner.connections -= 1


def _serve_connection(planner: Planner, conn: socket.socket) -> None:
    with conn:
        while True:
            try:
                msg = receive_message(conn)
            except (ConnectionError, OSError, ValueError):
                return
            op = msg.get("op")
            if isinstance(msg.get("local_rank"), int):
                with planner._cv:
                    planner.ranks_seen.add(msg["local_rank"])
            try:
                if op == "submit":
                    reply: dict[str, Any] = {
                        "ok": True,
                        "key": planner.submit(msg["doc"], order=int(msg.get("order", 0))),
                    }
                elif op == "view":
                    reply = planner.view(msg["key"], int(msg["rank"]), int(msg["iteration"]), float(msg["timeout_s"]))
                elif op == "plan":
                    reply = planner.plan(msg["key"], float(msg["timeout_s"]))
                elif op == "stats":
                    reply = planner.stats()
                elif op == "agree":
                    reply = {"ok": True, "value": planner.agree(str(msg["key"]), str(msg["value"]))}
                elif op == "drain":  # the owner's loader closed: exit once every rank has closed too
                    if not planner.draining:
                        planner.draining, planner.draining_since = True, time.monotonic()
                    reply = {"ok": True}
                elif op == "timings":  # a node's measured microbatches (the job's, gathered): refit
                    if planner.calibration is None:
                        planner.calibration = Calibration(msg["profile"], provenance=msg.get("provenance"))
                    planner.calibration.add(RankTiming.from_list(row) for row in msg["rows"])
                    planner.calibration.refit()
                    reply = {"ok": True}
                elif op == "calibrated":
                    fitted = planner.calibration.fitted if planner.calibration is not None else None
                    reply = {"ok": True, "profile": None if fitted is None else fitted.profile}
                else:
                    reply = {"ok": False, "error": {"type": "ValueError", "message": f"unknown op {op!r}"}}
            except Exception as exc:
                reply = {"ok": False, "error": _error_doc(exc)}
            try:
                send_message(conn, reply)
            except OSError:
                return


def _process_start_time(pid: int) -> str | None:
    """Field 22 of ``/proc/PID/stat`` (start time in clock ticks): tells a live pid from a reused one."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(pid: int, started: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return started is None or _process_start_time(pid) == started


def _leave(socket_path: str, why: str) -> None:
    """Remove the socket and exit now (daemon threads and all)."""
    with contextlib.suppress(OSError):
        os.unlink(socket_path)
    log.info("planner process %d exits: %s", os.getpid(), why)
    os._exit(0)


#: How long a drained process waits for a local rank that never connected (it failed before asking, or
#: asks late): the process still dies with its owner whatever this says.
DRAIN_GRACE_S = 60.0


def _watch(planner: Planner, socket_path: str, watch_pids: Sequence[int], *, local_ranks: int = 1) -> None:
    """Exit (removing the socket) when the parent's pipe closes, a watched process is gone, or the owner's
    loader closed and every one of the node's ``local_ranks`` has connected and closed again (after
    ``DRAIN_GRACE_S`` without a connection, whether or not all came: a rank that failed before asking never
    will). The owner's loader may close first, for instance when its rank refuses a configuration the
    others are still being served plans to refuse too: exiting then would fail them with a lost socket
    instead of their own error."""

    def leave(why: str) -> None:
        _leave(socket_path, why)

    def stdin_eof() -> None:
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        leave("its parent closed the pipe (the loader closed, or the training process died)")

    threading.Thread(target=stdin_eof, daemon=True, name="skrull-planner-parent").start()
    started = {pid: _process_start_time(pid) for pid in watch_pids}
    parent = os.getppid()
    while True:
        time.sleep(0.2)
        if os.getppid() != parent:
            leave(f"its parent {parent} died")
        for pid, start in started.items():
            if not _alive(pid, start):
                leave(f"the launcher (pid {pid}) is gone")
        if planner.draining and planner.connections == 0:
            if len(planner.ranks_seen) >= local_ranks:
                leave("its loader closed and every rank of the node has closed its connection")
            if time.monotonic() - planner.draining_since > DRAIN_GRACE_S:
                leave(f"its loader closed and no rank connected for {DRAIN_GRACE_S:g} s")


def serve(socket_path: str, *, watch_pids: Sequence[int] = (), local_ranks: int = 1) -> None:
    """The planner process's main: listen on ``socket_path``, solve, answer, die with the parent."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    planner = Planner()
    # PR_SET_PDEATHSIG delivers SIGTERM when the parent dies: leave cleanly, socket removed
    signal.signal(signal.SIGTERM, lambda *_: _leave(socket_path, "its parent died (SIGTERM)"))
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(socket_path)
    server.listen(256)
    threading.Thread(target=planner.solve_forever, daemon=True, name="skrull-planner-solve").start()
    threading.Thread(
        target=_watch,
        args=(planner, socket_path, watch_pids),
        kwargs={"local_ranks": local_ranks},
        daemon=True,
        name="skrull-planner-watch",
    ).start()
    while True:
        conn, _ = server.accept()
        threading.Thread(target=_handle, args=(planner, conn), daemon=True, name="skrull-planner-conn").start()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the planned loader's planner process (worker/planner/server.py)")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--watch-pid", type=int, action="append", default=[])
    parser.add_argument("--local-ranks", type=int, default=1, help="the node's ranks that connect (torchrun)")
    args = parser.parse_args(argv)
    serve(args.socket, watch_pids=args.watch_pid, local_ranks=args.local_ranks)


if __name__ == "__main__":
    main()

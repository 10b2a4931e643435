"""Planning beside training: one planner process per node that the loader starts and owns.

Why a process. Planning on a thread of the training process costs the training loop twice: every rank
computes the same plan (8 ranks per node, 8 times the CPU), and the planner holds the interpreter lock
the loop needs to launch its kernels, so a host-bound step slows down although ``next()`` never waits.
Here the plans of a node are computed once, in a separate interpreter:

- **Who plans.** Under ``torchrun`` the loader of local rank 0 of each node starts the planner process
  (``python -m skrull.worker.planner_process``); the other local ranks connect to it. Without torchrun each
  loader starts its own. Every node plans the same requests, and requests are ``deterministic``, so all
  nodes hold the same plans without sending plans over the network (per-node planning: N nodes spend N
  planner CPUs, never N x 8). What must agree across nodes for that is the request itself, budget
  included: see ``PlanningBudget``.
- **How ranks get their views.** A Unix-domain stream socket (``AF_UNIX``, node-local), one request and
  one answer per message (4-byte big-endian length, then JSON). A rank asks for its rank view of an
  iteration (docs/formats.md "Rank view"): a few hundred bytes, decoded in the rank's prefetch thread.
- **Ahead.** The loader submits requests ``plan_ahead`` iterations before it needs them; the process
  solves them in request order on its own interpreter, so planning overlaps training. It runs at the
  training processes' priority: a loop that waits for plans gains nothing from a starved planner; where
  cores are short the budgets shrink instead (``PlanningBudget``).
- **Its lifetime is the job's.** The process exits when its parent dies, whichever way: it reads a pipe
  from the parent and exits on end-of-file (the kernel closes the pipe when the parent dies, SIGKILL
  included), and on Linux it also asks for ``PR_SET_PDEATHSIG`` (``prctl``) when started from the main
  thread. Under torchrun it watches the launcher (the rank's parent) too: torchrun starts ranks in
  sessions of their own, so a SIGKILLed torchrun leaves its ranks running; the planner then exits and
  those ranks stop at their next plan with an error naming the launcher, instead of lingering. When the
  owner's loader is closed or dropped (its rank refused a configuration, say) while the process lives,
  the planner serves the node's other ranks until each has come and closed, then exits.

``ProcessPlans`` is the client: the same ``PlanSource`` calls as ``LocalPlans`` (worker/plan_sources.py).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import json
import logging
import math
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skrull.solver.budget import smallest_budget_s
from skrull.solver.errors import RequestError
from skrull.solver.io import plan_from_dict, plan_to_dict, request_from_dict
from skrull.solver.planning import solve
from skrull.solver.types import Parallel, Plan, Problem
from skrull.solver.worker_view import plan_rank_view
from skrull.worker.calibration import Calibration, RankTiming
from skrull.worker.plan_sources import plan_key

log = logging.getLogger("skrull.planner")

_HEADER = struct.Struct(">I")
#: Largest message either side accepts (a whole plan of a large request is a few MB).
MAX_MESSAGE_BYTES = 256 * 2**20
PR_SET_PDEATHSIG = 1


# -- wire -------------------------------------------------------------------------------------------


def _send(sock: socket.socket, doc: Mapping[str, Any]) -> None:
    body = json.dumps(doc, separators=(",", ":")).encode()
    sock.sendall(_HEADER.pack(len(body)) + body)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("planner process closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket) -> dict[str, Any]:
    (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if size > MAX_MESSAGE_BYTES:
        raise ConnectionError(f"message of {size} bytes exceeds {MAX_MESSAGE_BYTES}")
    doc: dict[str, Any] = json.loads(_recv_exact(sock, size))
    return doc


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
                msg = _recv(conn)
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
                _send(conn, reply)
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


# -- where the socket is, and who owns the process -------------------------------------------------------


def _torchrun_env() -> dict[str, str] | None:
    """What identifies this node of this torchrun job (None outside torchrun)."""
    env = os.environ
    if "LOCAL_RANK" not in env or "TORCHELASTIC_RUN_ID" not in env:
        return None
    keys = ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "TORCHELASTIC_RESTART_COUNT")
    return {k: env.get(k, "") for k in keys}


def _socket_path(token: str) -> str:
    digest = hashlib.sha256(token.encode()).hexdigest()[:20]
    return str(Path(tempfile.gettempdir()) / f"skrull-planner-{digest}.sock")


#: Loaders created in this process per loader key: the n-th loader of a key pairs with the n-th on every rank.
_INSTANCES: dict[str, int] = {}
_INSTANCES_LOCK = threading.Lock()
#: The planner processes this process started for a node under torchrun. Held for the life of this process:
#: the pipe to each (its stdin) must stay open while the node's other ranks are served, also after the
#: owner's loader is closed or dropped; this process's exit closes it, and the planner exits with it.
_NODE_PLANNERS: list[subprocess.Popen[bytes]] = []


def _local_world_size() -> int:
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def _set_pdeathsig() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class PlannerError(RuntimeError):
    """The planner process is gone or cannot be reached: the job cannot get plans."""


class ProcessPlans:
    """The client of the node's planner process (module doc); the loader's default ``PlanSource``.

    ``job_key`` names what every rank of the job shares (the loader's data and layout): under torchrun,
    the ranks of one node with the same ``job_key`` use one process, started by local rank 0.
    """

    def __init__(self, *, job_key: str = "", connect_timeout_s: float = 120.0) -> None:
        env = _torchrun_env()
        with _INSTANCES_LOCK:
            instance = _INSTANCES.get(job_key, 0)
            _INSTANCES[job_key] = instance + 1
        if env is None:  # a process of its own: a private planner
            self.socket_path = _socket_path(f"{os.getpid()}-{uuid.uuid4().hex}")
            self.owner = True
            watch: list[int] = []
        else:
            self.socket_path = _socket_path(json.dumps([env, job_key, instance], sort_keys=True))
            self.owner = os.environ.get("LOCAL_RANK") == "0"
            watch = [os.getppid()]  # the torchrun agent: its ranks run in sessions of their own
        self.shared = env is not None
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0")) if self.shared else 0
        self.connect_timeout_s = connect_timeout_s
        self._local = threading.local()
        #: every connection this client opened (one per thread that asked): all closed by ``close``
        self._socks: list[socket.socket] = []
        self._socks_lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._closed = False
        if self.owner:
            self._proc = self._start(watch)

    def _start(self, watch: Sequence[int]) -> subprocess.Popen[bytes]:
        import skrull

        root = str(Path(skrull.__file__).resolve().parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        # -P: ``-m`` would put the working directory first on the path, ahead of PYTHONPATH, so a skrull there
        # (another checkout) would plan with other code than the loader's
        cmd = [sys.executable, "-P", "-m", "skrull.worker.planner_process", "--socket", self.socket_path]
        for pid in watch:
            cmd += ["--watch-pid", str(pid)]
        if self.shared:
            cmd += ["--local-ranks", str(_local_world_size())]
        main = threading.current_thread() is threading.main_thread() and sys.platform.startswith("linux")
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, env=env, preexec_fn=_set_pdeathsig if main else None, close_fds=True
        )
        log.info("planner process %d started for this node (socket %s)", proc.pid, self.socket_path)
        if self.shared:
            with _INSTANCES_LOCK:
                _NODE_PLANNERS[:] = [p for p in _NODE_PLANNERS if p.poll() is None]
                _NODE_PLANNERS.append(proc)
        return proc

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def _connection(self) -> socket.socket:
        sock: socket.socket | None = getattr(self._local, "sock", None)
        if sock is not None:
            return sock
        deadline = time.monotonic() + self.connect_timeout_s
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise PlannerError(f"the planner process exited with status {self._proc.returncode} before answering")
            attempt = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                attempt.connect(self.socket_path)
                sock = attempt
                break
            except (FileNotFoundError, ConnectionRefusedError):
                attempt.close()
                if time.monotonic() > deadline:
                    raise PlannerError(
                        f"no planner process at {self.socket_path} after {self.connect_timeout_s} s: the loader of "
                        "local rank 0 starts it, with the same dataset, batch size, layout and profile as this one"
                    ) from None
                time.sleep(0.02)
        self._local.sock = sock
        with self._socks_lock:
            self._socks.append(sock)
        return sock

    def _call(self, msg: Mapping[str, Any], *, timeout_s: float | None = None) -> dict[str, Any]:
        sock = self._connection()
        sock.settimeout(None if timeout_s is None else timeout_s + 30.0)
        try:
            _send(sock, {**msg, "local_rank": self.local_rank})
            reply = _recv(sock)
        except (ConnectionError, OSError) as exc:
            self._local.sock = None
            sock.close()
            raise PlannerError(f"the planner process at {self.socket_path} is gone ({exc}); did the job's launcher or "
                               "local rank 0 die?") from exc  # fmt: skip
        if not reply.get("ok"):
            err = reply.get("error") or {}
            if err.get("type") == "RequestError":
                raise RequestError(err["field"], err["value"], err["reason"])
            if err.get("type") == "TimeoutError":
                raise TimeoutError(err.get("message"))
            raise PlannerError(f"{err.get('type')}: {err.get('message')}")
        return reply

    # -- PlanSource -------------------------------------------------------------------------------------

    def submit(self, doc: Mapping[str, Any], *, order: int = 0) -> str:
        key: str = self._call({"op": "submit", "doc": dict(doc), "order": order})["key"]
        return key

    def rank_view(self, plan_id: str, rank: int, iteration: int, *, timeout_s: float = 300.0) -> dict[str, Any]:
        return self.rank_view_and_solve(plan_id, rank, iteration, timeout_s=timeout_s)[0]

    def rank_view_and_solve(
        self, plan_id: str, rank: int, iteration: int, *, timeout_s: float = 300.0
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The rank view and how its plan was solved (``wall_s``, ``cpu_s``, ``budget_s``)."""
        msg = {"op": "view", "key": plan_id, "rank": rank, "iteration": iteration, "timeout_s": timeout_s}
        reply = self._call(msg, timeout_s=timeout_s)
        return reply["view"], reply["solve"]

    def plan(self, plan_id: str, *, timeout_s: float = 300.0) -> Plan:
        reply = self._call({"op": "plan", "key": plan_id, "timeout_s": timeout_s}, timeout_s=timeout_s)
        return plan_from_dict(reply["plan"])

    def stats(self) -> dict[str, Any]:
        return self._call({"op": "stats"})

    def serves_whole_job(self, world_size: int) -> bool:
        """Every rank of a ``world_size`` job asks this planner process: it is the node's shared one
        (torchrun) and the job is that one node (``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE`` are both
        ``world_size``). Then the ranks can agree through it (``compare_set``) without a
        ``torch.distributed`` group. Not otherwise: a private planner (a launcher of one's own starts one
        per rank) or a job over several nodes, whose planner processes share nothing."""
        if not self.shared:
            return False
        try:
            world = int(os.environ.get("WORLD_SIZE", "-1"))
        except ValueError:
            return False
        return world == world_size == _local_world_size()

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        """The ``torch.distributed`` store's ``compare_set`` as ``PlanningBudget.decide`` uses it (``expected``
        empty: set if absent), kept by the node's planner process: the first proposal of ``key`` is returned
        to every rank."""
        if expected != "":
            raise ValueError(f"compare_set: expected={expected!r}; the planner process keeps first proposals only")
        value: str = self._call({"op": "agree", "key": key, "value": desired})["value"]
        return value.encode()

    def add_timings(
        self, rows: Sequence[RankTiming], *, profile: Any, provenance: Mapping[str, Any] | None = None
    ) -> None:
        """Hand the job's measured microbatches to the planner process, which refits its profile."""
        msg = {"op": "timings", "rows": [r.to_list() for r in rows], "profile": profile, "provenance": provenance}
        self._call(msg)

    def calibrated_profile(self) -> dict[str, Any] | None:
        """The planner process's current calibrated profile document (None: not enough measured yet)."""
        profile: dict[str, Any] | None = self._call({"op": "calibrated"})["profile"]
        return profile

    def close(self) -> None:
        """Close this rank's connections. The owner's close never waits for the node's other ranks (they may
        be in a collective with it): the process finishes serving them and exits once none is connected,
        or when the owner's process exits (the pipe)."""
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(PlannerError, OSError):
                self._call({"op": "drain"})
        self._local.sock = None
        with self._socks_lock:
            socks, self._socks = self._socks, []
        for sock in socks:
            sock.close()
        self._closed = True

    def __del__(self) -> None:
        """A loader dropped without ``close``: a private planner is killed (nobody else uses it); a node's
        planner drains as on ``close``, since the node's other ranks may still be asking it for plans."""
        proc = getattr(self, "_proc", None)
        if proc is None or proc.poll() is not None or getattr(self, "_closed", False):
            return
        with contextlib.suppress(Exception):
            if getattr(self, "shared", False):
                self.close()
            else:
                proc.kill()


# -- the planning budget ----------------------------------------------------------------------------


def _two_digits(seconds: float) -> float:
    """Two significant digits: budgets read well in the log and differ only when the step really changed."""
    if seconds <= 0:
        return 0.0
    factor = 10.0 ** (1 - math.floor(math.log10(seconds)))
    return round(seconds * factor) / factor


def _two_digits_up(seconds: float) -> float:
    if seconds <= 0:
        return 0.0
    factor = 10.0 ** (1 - math.floor(math.log10(seconds)))
    return math.ceil(seconds * factor) / factor


def unagreed_budget_s(
    solver: str, batch_sizes: Sequence[int], parallel: Parallel, *, deferring: bool = False
) -> float | None:
    """The budget of a request when the ranks have nothing to agree through (no ``torch.distributed`` group,
    ranks given explicitly, several of them, not all asking one planner process): the planner's own minimum
    for the request (``smallest_budget_s``, two significant digits up), a function of the request alone, so
    every rank asks for the same plan. None for a planner without an estimate (the planner's default then)."""
    floor = smallest_budget_s(solver, batch_sizes, parallel, deferring=deferring)
    return _two_digits_up(floor) if floor > 0 else None


class PlanningBudget:
    """``time_budget_s`` of each request, derived from the measured step time so planning keeps up.

    ``budget(chunk) = share * step_s * iterations_per_request / overrun``, two significant digits, at
    least the planner's own minimum for the request (``smallest_budget_s``), at most ``max_s``:

    - ``step_s``: the median period between the loop's ``next()`` calls over the last 16 iterations (the
      whole step: forward, backward, optimizer, and the loader);
    - ``share`` (default 0.5): planning may use half a step of one core per iteration, so it keeps up
      even when its process shares a core with the loop;
    - ``overrun``: the median of ``wall / budget`` of the plans solved so far (at least 1): a planner that
      takes longer than its budget (process start, validation, a slow core) gets less next time;
    - behind: when the loader's prefetch thread had to wait for two of the last four plans, the share is
      quartered until planning is ahead again.

    Before the first steps are measured the budget is ``initial_s`` (small: the first plans get ahead).
    The budget is part of the request,
    so every rank and node must ask with the same one to get the same plan: each loader proposes its
    budget in the job's ``torch.distributed`` store with ``compare_set``, and the first proposal of a request
    is the one every rank uses (``decide``). Without ``torch.distributed`` (ranks given explicitly) the
    ranks agree through the node's planner process when every rank of the job asks it (one torchrun node:
    ``ProcessPlans.serves_whole_job``, ``compare_set``). Ranks that share no planner process (a launcher of
    one's own starts one per rank; nodes each run their own) have nothing to agree through: the loader
    adapts only when it is the job's one rank (DP1 x CP1) and otherwise asks for the planner's minimum for
    each request (``unagreed_budget_s``), which every rank computes alike.
    Decisions are kept (``state_dict``), so a resumed run asks for the
    same plans.
    """

    def __init__(self, *, share: float = 0.5, initial_s: float = 0.02, max_s: float = 10.0) -> None:
        if not 0 < share <= 4:
            raise RequestError("planning_share", share, "must be in (0, 4]")
        self.share, self.initial_s, self.max_s = share, initial_s, max_s
        self._periods: deque[float] = deque(maxlen=16)
        self._overruns: deque[float] = deque(maxlen=16)
        self._solves = 0
        self._waits: deque[float] = deque(maxlen=4)
        #: budgets decided, by request ("epoch/chunk")
        self.decided: dict[str, float] = {}
        self._lock = threading.Lock()

    def record_step(self, seconds: float) -> None:
        with self._lock:
            self._periods.append(seconds)

    def record_solve(self, meta: Mapping[str, Any]) -> None:
        """Learn how the planner keeps its budgets; the first plan (the process warming up) is left out."""
        budget, wall = meta.get("budget_s"), meta.get("wall_s")
        if isinstance(budget, int | float) and budget > 0 and isinstance(wall, int | float):
            with self._lock:
                self._solves += 1
                if self._solves > 1:
                    self._overruns.append(wall / budget)

    def record_wait(self, seconds: float) -> None:
        """How long a prefetch thread waited for a plan to be solved: planning is behind when it waits."""
        with self._lock:
            self._waits.append(seconds)

    @property
    def step_s(self) -> float | None:
        with self._lock:
            return sorted(self._periods)[len(self._periods) // 2] if self._periods else None

    def decide(
        self,
        request: str,
        *,
        solver: str,
        batch_sizes: Sequence[int],
        parallel: Parallel,
        store: Any = None,
        key: str = "",
        deferring: bool = False,
    ) -> float:
        """The budget of ``request`` ("epoch/chunk"): this loader's proposal, or the one already agreed in
        ``store`` (the first proposal of any rank wins: ``compare_set``), so every rank and node asks for the
        same plan."""
        with self._lock:
            if request in self.decided:
                proposal, why = self.decided[request], "kept from before (state_dict)"
            else:
                proposal, why = self._propose(
                    solver=solver, batch_sizes=batch_sizes, parallel=parallel, deferring=deferring
                )
        budget = proposal
        if store is not None:
            agreed = store.compare_set(f"{key}/{request}", "", repr(proposal))
            budget = float(agreed.decode() if isinstance(agreed, bytes) else agreed)
            if budget != proposal:
                why = f"agreed by another rank (this one proposed {proposal:g} s)"
        log.info("planning budget of request %s: %g s (%s)", request, budget, why)
        with self._lock:
            self.decided[request] = budget
        return budget

    def _propose(
        self, *, solver: str, batch_sizes: Sequence[int], parallel: Parallel, deferring: bool = False
    ) -> tuple[float, str]:
        periods, overruns = sorted(self._periods), sorted(self._overruns)
        overrun = max(1.0, overruns[len(overruns) // 2]) if len(overruns) >= 3 else 1.0
        behind = sum(w > 1e-3 for w in self._waits) >= 2  # plans were not ready when asked for: catch up
        share = self.share / 4 if behind else self.share
        if not periods:
            raw, why = self.initial_s, "no step measured yet"
        else:
            step = periods[len(periods) // 2]
            raw = share * step * len(batch_sizes) / overrun
            why = (f"{share:g} x step {step * 1e3:.1f} ms x {len(batch_sizes)} iteration(s)"
                   f" / overrun {overrun:.2f}{'; behind: a quarter of the share' if behind else ''}")  # fmt: skip
        floor = _two_digits_up(smallest_budget_s(solver, batch_sizes, parallel, deferring=deferring))
        budget = min(self.max_s, max(_two_digits(raw), floor))
        if budget != _two_digits(raw):
            why += f"; kept within [{floor:g} s (the planner's minimum), {self.max_s:g} s]"
        return budget, why

    def state_dict(self, *, epoch: int, from_chunk: int) -> dict[str, float]:
        """The budgets decided for the requests not yet trained: ``epoch``'s, from ``from_chunk`` on."""
        with self._lock:
            return {
                r: b
                for r, b in self.decided.items()
                if r.split("/")[0] == str(epoch) and int(r.split("/")[1]) >= from_chunk
            }

    def load_state_dict(self, decided: Mapping[str, Any]) -> None:
        with self._lock:
            for r, b in decided.items():
                self.decided[str(r)] = float(b)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the planned loader's planner process (worker/planner_process.py)")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--watch-pid", type=int, action="append", default=[])
    parser.add_argument("--local-ranks", type=int, default=1, help="the node's ranks that connect (torchrun)")
    args = parser.parse_args(argv)
    serve(args.socket, watch_pids=args.watch_pid, local_ranks=args.local_ranks)


if __name__ == "__main__":
    main()

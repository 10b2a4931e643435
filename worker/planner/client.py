"""The rank's side of the node's planner process: ``ProcessPlans``, the loader's default ``PlanSource``.

It starts the planner process (server.py) or connects to the one its node's local rank 0 started, and
offers the same calls as ``LocalPlans`` (worker/plan_sources.py) over the node-local socket (wire.py). Under
torchrun the socket's name comes from what identifies the node of the job, so every rank of a node finds
the same process without being told.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from skrull.solver.errors import RequestError
from skrull.solver.io import plan_from_dict
from skrull.solver.types import Plan
from skrull.worker.calibration import RankTiming
from skrull.worker.planner.wire import receive_message, send_message

log = logging.getLogger("skrull.planner")
#: ``prctl`` option: the signal the kernel sends this process when its parent dies (linux/prctl.h)
PR_SET_PDEATHSIG = 1


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
        cmd = [sys.executable, "-P", "-m", "skrull.worker.planner.server", "--socket", self.socket_path]
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
            send_message(sock, {**msg, "local_rank": self.local_rank})
            reply = receive_message(sock)
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

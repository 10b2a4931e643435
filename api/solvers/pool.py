"""The pool of solver processes: they claim queued jobs from the store, so solving never runs on the
server's event loop, and a supervisor makes sure no job is left ``solving`` by a process that is gone.

* Each solver process loops: ``claim`` the oldest queued job (a lease), solve it (``api.solvers.job_solving``),
  ``complete`` or ``fail`` it, claim again; when the queue is empty it sleeps until the server wakes it
  (one token per submission on a queue) or ``idle_poll_s`` passes. A thread renews the lease every
  ``lease_s / 3`` while it solves.
* The supervisor thread waits on the processes' sentinels. When one dies, every job it held is queued
  again while it has attempts left (``max_attempts = 2``: retried once), else failed with the reason
  (exit code or signal); a new process takes its place. It also fails and kills a solve running past
  its hard limit (``solve_timeout_factor * time_budget_s + solve_timeout_grace_s``), and takes back
  expired leases of any owner (a server that crashed while solving).
* Processes report claims, published iterations and ends to the server over an event queue; the server
  turns them into metrics and long-poll wake-ups.
* Shutdown lets running solves finish for ``grace_s``, then kills them; their jobs are queued again
  without charging an attempt, so a restart loses nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import gc
import importlib
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any

from skrull.api.errors import ApiProblem, from_failure
from skrull.api.metrics import SolverMetrics
from skrull.api.settings import Settings
from skrull.api.sizes import check_plan_tokens
from skrull.api.solvers.job_solving import LeaseLostError, solve_job
from skrull.api.store.base import ClaimedJob, IterationRecord, JobStore, is_store_unavailable
from skrull.api.store.open import open_store
from skrull.solver.planners.minmax_ilp import preload_cp_sat

log = logging.getLogger("skrull.solving")

#: Events a solver process sends: ("claimed", job_id, pid, cpu_s at the claim), ("iteration", job_id, index),
#: ("done", job_id, outcome, solver, seconds, recorded) with outcome solved|failed|lost; ``recorded`` is
#: True when the solver process counted the solve's duration itself (``api.metrics``, multi-process mode).
Event = tuple[Any, ...]
EventHandler = Callable[[Event], None]


def import_plugins(modules: Sequence[str]) -> None:
    """Import the configured plugin modules (they may register planners with the registry)."""
    for name in modules:
        importlib.import_module(name)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerConfig:
    """What one solver process runs with: the service's settings as they are (pickled into the process when
    it is spawned, so a new setting reaches the processes without being copied field by field) and the owner
    name its leases carry."""

    settings: Settings
    owner: str
    #: A process kept for short work claims only jobs of at most this time budget (None: any job).
    max_budget_s: float | None = None


#: A lease is renewed this many times per lease period, so two renewals can be lost (a stalled store,
#: a long pause of the process) before it expires.
RENEWALS_PER_LEASE = 3


#: Exit status of a solver process that found its server gone while solving.
EXIT_ORPHANED = 75
#: Exit status of a solver process whose lease was lost mid-solve (its plan deleted, or its job taken back).
EXIT_LEASE_LOST = 76
#: Exit status of a solver process whose store failed under its solve (a full disk, a database that went
#: away): its job is given back without charging the attempt, once the store takes writes again.
EXIT_STORE_FAILED = 77
#: A solve whose wall time passes this many times its hard limit is stopped even if it received little CPU
#: (it waits on something that will not come); the hard limit itself is judged on CPU time received.
WALL_LIMIT_FACTOR = 4.0


class StoreFailedError(RuntimeError):
    """The store failed under a solve (``store.base.is_store_unavailable``): not the job's fault."""


def _out_of_space(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def tree_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) of process ``pid``, its reaped children and its live descendants (an
    exact solver's forked child), from ``/proc``; None where ``/proc`` cannot tell (the caller then judges
    on wall time)."""
    total_ticks = 0
    stack, seen = [pid], set()
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open(f"/proc/{p}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            if p == pid:
                return None
            continue
        total_ticks += sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    stack.extend(int(c) for c in fh.read().split())
    return total_ticks / os.sysconf("SC_CLK_TCK")


class _Heartbeat:
    """Renews a lease every ``lease_s / RENEWALS_PER_LEASE`` while a job is being solved.

    A solver whose server died (even by SIGKILL) is an orphan: nobody reads its events, and a new server
    may take its job back once the lease expires. So the heartbeat renews only while the server lives;
    seeing it gone, it ends the process at once (``EXIT_ORPHANED``), well within the lease. Whatever it would
    have written is refused anyway (the stores check that a lease is unexpired before every write:
    fencing), so a solver paused past its lease cannot overwrite the job's next owner."""

    def __init__(self, store: JobStore, *, job_id: str, owner: str, lease_s: float) -> None:
        self._store, self._job_id, self._owner, self._lease_s = store, job_id, owner, lease_s
        self._stop = threading.Event()
        self._parent = multiprocessing.parent_process()
        self._thread = threading.Thread(target=self._run, name="lease-heartbeat", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._lease_s / RENEWALS_PER_LEASE):
            if self._parent is not None and not self._parent.is_alive():
                log.warning("job %s: the server is gone; this solver stops, its lease expires", self._job_id)
                os._exit(EXIT_ORPHANED)
            try:
                renewed = self._store.heartbeat(job_id=self._job_id, owner=self._owner, lease_s=self._lease_s)
            except Exception as exc:
                if not is_store_unavailable(exc):
                    raise
                log.warning("job %s: the store failed (%s); its job is given back uncharged", self._job_id, exc)
                os._exit(EXIT_STORE_FAILED)
            if not renewed:
                # The lease is gone: the plan was deleted, or the job was taken back. Nothing this solve
                # writes would be accepted (fencing), so it stops now rather than burn CPU to its budget;
                # the exact solver's forked child dies with this process (solver.ilp.runner).
                log.warning("job %s: the lease is gone (deleted or taken back); this solve stops", self._job_id)
                os._exit(EXIT_LEASE_LOST)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def _failure(exc: BaseException) -> str:
    return json.dumps(from_failure(exc).document())


def run_claimed(store: JobStore, job: ClaimedJob, config: WorkerConfig, events: Any) -> str:
    """Solve one claimed job to its end; the outcome (solved, failed, or lost when the lease was lost)."""
    owner, settings = config.owner, config.settings

    def check_iteration(record: IterationRecord) -> None:
        what = f"iteration {record.index}"
        check_plan_tokens(record.doc_json, settings.max_iteration_tokens, what=what, max_bytes=settings.max_plan_bytes)

    def publish(record: IterationRecord) -> bool:
        check_iteration(record)
        try:
            ok = store.publish_iteration(record, owner=owner)
        except Exception as exc:
            if is_store_unavailable(exc):
                raise StoreFailedError(str(exc)) from exc
            raise
        if ok:
            events.put(("iteration", job.job_id, record.index))
        return ok

    with _Heartbeat(store, job_id=job.job_id, owner=owner, lease_s=settings.lease_s):
        try:
            plan_json, rest = solve_job(
                job.job_id, job.request_json, done=store.iterations(job.job_id), publish=publish
            )
            for record in rest:
                check_iteration(record)
            check_plan_tokens(plan_json, settings.max_plan_tokens, what="the plan", max_bytes=settings.max_plan_bytes)
        except LeaseLostError:
            return "lost"
        except StoreFailedError:
            raise
        except Exception as exc:  # every failure of a solve is stored with the job, never re-raised
            if _out_of_space(exc):  # the planner's own files met a full disk: not the job's fault either
                raise StoreFailedError(str(exc)) from exc
            log.info("job %s failed: %s", job.job_id, exc)
            return "failed" if store.fail(job_id=job.job_id, owner=owner, error_json=_failure(exc)) else "lost"
        return (
            "solved" if store.complete(job_id=job.job_id, owner=owner, plan_json=plan_json, iterations=rest) else "lost"
        )


def worker_main(config: WorkerConfig, wake: Any, events: Any, stop: Any) -> None:
    """Entry point of a solver process."""
    # Ctrl-C, or a SIGTERM sent to the whole process group (a service manager's stop), reaches the solver
    # processes too: the server decides (it lets them finish, then ends them); dying of it first made a
    # normal shutdown log "solver process ... was killed by signal SIGTERM"
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    settings = config.settings
    import_plugins(settings.plugin_modules)
    preload_cp_sat()  # its first import (~0.4 s) would otherwise fall inside a job's time budget
    store = open_store(settings.db, sqlite_synchronous=settings.sqlite_synchronous, pool_size=3)
    metrics = SolverMetrics()
    parent = multiprocessing.parent_process()
    try:
        # A process whose server died (even by SIGKILL) claims nothing more; the job in hand is abandoned by its
        # heartbeat (_Heartbeat) and taken back by a live server once its lease expires.
        while not stop.is_set() and (parent is None or parent.is_alive()):
            try:
                job = store.claim(owner=config.owner, lease_s=settings.lease_s, max_budget_s=config.max_budget_s)
            except Exception as exc:  # the store is full or unreachable: wait for it rather than die
                log.warning("claiming a job failed (%s); retrying in %.1f s", exc, settings.idle_poll_s)
                stop.wait(settings.idle_poll_s)
                continue
            if job is None:
                if store.notifies:  # the store pushes new work from any machine (LISTEN/NOTIFY)
                    store.wait_for_work(settings.idle_poll_s)
                else:
                    with contextlib.suppress(queue.Empty):
                        wake.get(timeout=settings.idle_poll_s)
                continue
            events.put(("claimed", job.job_id, os.getpid(), tree_cpu_s(os.getpid()) or 0.0))
            start = time.perf_counter()
            try:
                outcome = run_claimed(store, job, config, events)
            except Exception as exc:
                if not (isinstance(exc, StoreFailedError) or is_store_unavailable(exc)):
                    raise
                # The store (or the disk) failed under this job: it is not the job's fault, so it must not
                # spend an attempt. The process ends; its supervisor gives the job back uncharged as soon as
                # the store takes writes again (SolverPool._release_pending), and it is solved then.
                log.warning("job %s: the store failed under the solve (%s); given back uncharged", job.job_id, exc)
                os._exit(EXIT_STORE_FAILED)
            seconds = time.perf_counter() - start
            recorded = metrics.solved(solver=job.solver, outcome=outcome, seconds=seconds)
            events.put(("done", job.job_id, outcome, job.solver, seconds, recorded))
    finally:
        store.close()


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "is gone"
    if exitcode < 0:
        try:
            return f"was killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    if exitcode == EXIT_LEASE_LOST:
        return "stopped its solve: the lease was lost (the plan was deleted or taken back)"
    if exitcode == EXIT_STORE_FAILED:
        return "stopped its solve: the store failed (full or unreachable)"
    return f"exited with status {exitcode}"


#: A process that dies sooner than this after starting counts as a crash loop: it is restarted after
#: a delay that starts at ``FIRST_RESPAWN_DELAY_S`` and doubles with every such death, up to
#: ``MAX_RESPAWN_DELAY_S``.
FAST_DEATH_S = 5.0
FIRST_RESPAWN_DELAY_S = 0.5
MAX_RESPAWN_DELAY_S = 30.0


@dataclass(slots=True)
class _Slot:
    process: BaseProcess
    owner: str
    generation: int
    started_at: float
    fast_deaths: int = 0
    respawn_at: float | None = None  # set while a dead process waits to be replaced


class SolverPool:
    """``num_processes`` solver processes on the store at ``db``, supervised (see the module docstring)."""

    def __init__(self, settings: Settings, *, store: JobStore, on_event: EventHandler) -> None:
        """The pool ``settings`` describe (the server's and ``skrull solver-worker``'s alike), on ``store``."""
        self._store = store
        #: ``solver_processes`` take any job; ``short_solver_processes`` more (only when there are solver processes
        #: at all) take only jobs of at most ``short_job_budget_s``, so a short job never waits behind long solves.
        self.short_processes = settings.short_solver_processes if settings.solver_processes > 0 else 0
        self.short_budget_s = settings.short_job_budget_s
        self.num_processes = settings.solver_processes + self.short_processes
        self._max_attempts = settings.max_attempts
        self._interval_s = settings.supervise_interval_s
        self._hard_limit_s: Callable[[float], float] = settings.hard_limit_s
        self._on_event = on_event
        self._config = WorkerConfig(settings=settings, owner="")
        self._ctx = multiprocessing.get_context("spawn")
        self._wake: Any = self._ctx.Queue()
        self._events: Any = self._ctx.Queue()
        self._stop: Any = self._ctx.Event()
        self._stopping = False
        self._slots: list[_Slot] = []
        #: owners of dead solver processes whose jobs are still to be released (the store failed):
        #: {owner: (reason, whether the attempt counts)}
        self._unreleased: dict[str, tuple[str, bool]] = {}
        #: CPU seconds of each solver process's tree when it claimed its current job: {job_id: (pid, cpu_s)}
        self._claim_cpu: dict[str, tuple[int, float]] = {}
        self._lock = threading.Lock()
        self.instance = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._threads: list[threading.Thread] = []

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        self.recover_expired()
        for slot in range(self.num_processes):
            self._slots.append(self._spawn(slot, generation=0))
        for target, name in ((self._read_events, "solver-events"), (self._supervise, "solver-supervisor")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def _spawn(self, slot: int, *, generation: int, fast_deaths: int = 0) -> _Slot:
        owner = f"{self.instance}:{slot}:{generation}"
        short = slot >= self.num_processes - self.short_processes
        config = dataclasses.replace(self._config, owner=owner, max_budget_s=self.short_budget_s if short else None)
        process = self._ctx.Process(
            target=worker_main,
            args=(config, self._wake, self._events, self._stop),
            name=f"skrull-solver-{slot}{'-short' if short else ''}",
            daemon=True,
        )
        process.start()
        return _Slot(
            process=process, owner=owner, generation=generation, started_at=time.monotonic(), fast_deaths=fast_deaths
        )

    def stop(self, *, grace_s: float = 5.0) -> None:
        """Let running solves finish for ``grace_s``, then kill; queue their jobs again, uncharged."""
        self._stopping = True
        self._stop.set()
        for _ in self._slots:
            self._wake.put(1)
        deadline = time.monotonic() + grace_s
        for s in self._slots:
            s.process.join(max(0.0, deadline - time.monotonic()))
        for s in self._slots:
            if s.process.is_alive():
                s.process.kill()
                s.process.join()
        reason = json.dumps(
            ApiProblem(
                status=503,
                slug="server-stopped",
                title="server stopped",
                detail="the server stopped while this job was being solved; it was queued again",
            ).document()
        )
        for s in self._slots:
            for rec in self._store.release(
                owner=s.owner, reason_json=reason, max_attempts=self._max_attempts, count_attempt=False
            ):
                self._on_event(("recovered", rec.job_id, rec.status))
        self._events.put(None)
        for thread in self._threads:
            thread.join(timeout=5)
        for q in (self._wake, self._events):
            q.cancel_join_thread()
            q.close()
        # Release the queues' and event's semaphores now: a server stopped by a signal exits without
        # running finalizers, and the resource tracker would report them as leaked.
        self._wake = self._events = self._stop = None
        gc.collect()

    # -- what the server uses --------------------------------------------------------------------------

    def wake(self) -> None:
        if self.num_processes:
            self._wake.put_nowait(1)

    def alive(self) -> int:
        return sum(1 for s in self._slots if s.respawn_at is None and s.process.is_alive())

    # -- threads ---------------------------------------------------------------------------------------

    def _read_events(self) -> None:
        while True:
            try:
                event = self._events.get()
            except (EOFError, OSError):
                return
            if event is None:
                return
            if event[0] == "claimed" and len(event) > 2:
                self._claim_cpu[str(event[1])] = (int(event[2]), float(event[3]))
            elif event[0] == "done":
                self._claim_cpu.pop(str(event[1]), None)
            try:
                self._on_event(event)
            except Exception:  # a bad handler must not stop the reader
                log.exception("event handler failed on %r", event)

    def _supervise(self) -> None:
        while not self._stopping:
            sentinels = {s.process.sentinel: k for k, s in enumerate(self._slots) if s.respawn_at is None}
            ready = multiprocessing.connection.wait(list(sentinels), timeout=self._interval_s)
            if self._stopping:
                return
            # Every step is guarded: a store error (disk full, a lost connection) must not end supervision,
            # or no dead solver would ever be replaced; what failed is tried again on the next pass.
            for sentinel in ready:
                try:
                    self._handle_death(sentinels[sentinel])  # type: ignore[index]
                except Exception:
                    log.exception("handling a solver process's death failed; retrying on the next pass")
            now = time.monotonic()
            for k, slot in enumerate(self._slots):
                if slot.respawn_at is not None and now >= slot.respawn_at:
                    try:
                        self._slots[k] = self._spawn(k, generation=slot.generation + 1, fast_deaths=slot.fast_deaths)
                    except Exception:
                        log.exception("restarting solver process slot %d failed; retrying", k)
                        slot.respawn_at = now + FIRST_RESPAWN_DELAY_S
                        continue
                    self._on_event(("restarted", slot.owner))
            self._release_pending()
            try:
                self._enforce_deadlines()
                self.recover_expired()
            except Exception:
                log.exception("supervision pass failed")

    def _handle_death(self, k: int) -> None:
        """Take back the dead process's jobs now; schedule its replacement (delayed in a crash loop)."""
        slot = self._slots[k]
        slot.process.join()
        what = describe_exit(slot.process.exitcode)
        log.warning("solver process %s (%s) %s", slot.process.pid, slot.owner, what)
        store_failed = slot.process.exitcode == EXIT_STORE_FAILED
        reason = ApiProblem(
            status=503 if store_failed else 500,
            slug="store-unavailable" if store_failed else "solver-died",
            title="the store failed under the solve" if store_failed else "the solver process died",
            detail=f"solver process {slot.process.pid} {what} while solving this job"
            + ("; it was queued again without spending an attempt" if store_failed else ""),
        )
        # The replacement is scheduled before the store is written: a store that fails now (disk full) must
        # not leave the slot without a process; its jobs are released on a later pass (_release_pending).
        self._unreleased[slot.owner] = (json.dumps(reason.document()), not store_failed)
        now = time.monotonic()
        fast = now - slot.started_at < FAST_DEATH_S and slot.process.exitcode != EXIT_LEASE_LOST
        slot.fast_deaths = slot.fast_deaths + 1 if fast else 0
        delay = (
            0.0
            if slot.fast_deaths == 0
            else min(MAX_RESPAWN_DELAY_S, FIRST_RESPAWN_DELAY_S * 2 ** (slot.fast_deaths - 1))
        )
        if delay:
            log.warning("solver process slot %d is crash-looping; restarting in %.1f s", k, delay)
        slot.respawn_at = now + delay
        self._release_pending()

    def _release_pending(self) -> None:
        """Queue again (or fail) the jobs of dead solver processes; an owner whose release fails (the store
        is full or unreachable) stays pending for the next supervision pass."""
        for owner, (reason_json, charged) in list(self._unreleased.items()):
            try:
                released = self._store.release(
                    owner=owner, reason_json=reason_json, max_attempts=self._max_attempts, count_attempt=charged
                )
            except Exception as exc:
                log.warning("could not release the jobs of %s yet (%s); retrying", owner, exc)
                return
            del self._unreleased[owner]
            for rec in released:
                self._on_event(("recovered", rec.job_id, rec.status))
                if rec.status == "queued":
                    self.wake()

    def _enforce_deadlines(self) -> None:
        """Fail and stop a solve past its hard limit, ``factor * time_budget_s + grace``, judged on the CPU time
        its solver process (and its children) received since the claim (what ``solve.cpu_ms`` reports): a
        loaded machine that gives a solve a fraction of a core does not fail it. A solve whose wall time
        passes ``WALL_LIMIT_FACTOR`` times the hard limit is stopped too (it is waiting, not solving)."""
        owners = {s.owner: s for s in self._slots}
        now = time.time()
        for job in self._store.solving_owned():
            slot = owners.get(job.lease_owner or "")
            if slot is None or job.started_at is None:
                continue
            limit = self._hard_limit_s(job.time_budget_s)
            elapsed = now - job.started_at
            cpu_s = self._cpu_since_claim(job.job_id, slot.process.pid)
            if cpu_s is None:  # no /proc, or the claim not seen yet: wall time stands in
                cpu_s = elapsed
            if cpu_s <= limit and elapsed <= WALL_LIMIT_FACTOR * limit:
                continue
            detail = (
                f"solving received {cpu_s:.1f} s of CPU in {elapsed:.1f} s, past the hard limit of {limit:.1f} s "
                f"of CPU for time_budget_s={job.time_budget_s}; the solver process was stopped"
                if cpu_s > limit
                else f"solving ran {elapsed:.1f} s (receiving {cpu_s:.1f} s of CPU), past {WALL_LIMIT_FACTOR:g} "
                f"times the hard limit of {limit:.1f} s for time_budget_s={job.time_budget_s}; the solver "
                "process was stopped"
            )
            problem = ApiProblem(
                status=500, slug="solve-timeout", title="the solve ran past its hard limit", detail=detail
            )
            if self._store.fail(job_id=job.job_id, owner=job.lease_owner, error_json=json.dumps(problem.document())):
                slot.process.kill()
                self._claim_cpu.pop(job.job_id, None)
                self._on_event(("done", job.job_id, "failed", job.solver, elapsed, False))

    def _cpu_since_claim(self, job_id: str, pid: int | None) -> float | None:
        start = self._claim_cpu.get(job_id)
        if pid is None or start is None or start[0] != pid:
            return None
        now = tree_cpu_s(pid)
        return None if now is None else max(0.0, now - start[1])

    def recover_expired(self) -> None:
        reason = ApiProblem(
            status=500,
            slug="lease-expired",
            title="the solver stopped renewing its lease",
            detail="the process solving this job stopped renewing its lease (its server or process vanished)",
        )
        for rec in self._store.recover_expired(
            reason_json=json.dumps(reason.document()), max_attempts=self._max_attempts
        ):
            self._on_event(("recovered", rec.job_id, rec.status))
            if rec.status == "queued":
                self.wake()

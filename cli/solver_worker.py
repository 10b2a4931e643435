"""``skrull solver-worker``: solver processes apart from the API, on any machine that reaches the store.

It claims jobs from the shared store (``--db postgresql://...``; a SQLite path works on the API's own
machine), solves them, publishes iterations and plans, and renews its leases, exactly as a server's
own solver processes do (``api.solvers.pool.SolverPool``). It also sweeps expired leases, so a job whose
worker machine died is queued again even when no API server runs solvers. SIGTERM or Ctrl-C lets
running solves finish for a few seconds, then queues what is left again without charging an attempt.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from typing import Any

from skrull.cli.serve import check_db_folder, settings_from_args
from skrull.solver.errors import RequestError

SHUTDOWN_GRACE_S = 5.0

_FLAGS = {"db": "--db", "solver_processes": "--processes", "lease_s": "--lease-s"}


def add_parser(sub: Any) -> None:
    p = sub.add_parser("solver-worker", help="solve queued plans from a shared job store (no HTTP)")
    p.add_argument(
        "--db", default=None, metavar="URL", help="job store: postgresql://... URL or SQLite path (env SKRULL_DB)"
    )
    p.add_argument(
        "--processes",
        dest="solver_processes",
        type=int,
        default=None,
        help="solver processes (default: one per CPU but one; env SKRULL_SOLVER_PROCESSES)",
    )
    p.add_argument(
        "--lease-s", type=float, default=None, help="lease per claimed job, renewed every third (env SKRULL_LEASE_S)"
    )
    p.add_argument("--log-level", default="info", help="log level (default info)")
    p.set_defaults(func=cmd_solver_worker)


def cmd_solver_worker(args: argparse.Namespace) -> int:
    try:
        from skrull.api.solvers.pool import Event, SolverPool, import_plugins
        from skrull.api.store.open import open_store
    except ImportError as exc:
        raise RequestError("solver-worker", exc.name, "needs the api extra: pip install 'skrull[api]'") from None
    settings = settings_from_args(args, _FLAGS)
    if settings.solver_processes < 1:
        raise RequestError("--processes", settings.solver_processes, "a solver worker needs at least one process")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    log = logging.getLogger("skrull.solver_worker")
    import_plugins(settings.plugin_modules)
    check_db_folder(settings.db)
    try:
        store = open_store(settings.db, sqlite_synchronous=settings.sqlite_synchronous, pool_size=2)
    except (ConnectionError, OSError) as exc:
        raise RequestError("--db", settings.db, str(exc)) from None

    def on_event(event: Event) -> None:
        if event[0] == "done":
            log.info("job %s %s by %s in %.2f s", event[1], event[2], event[3], event[4])
        elif event[0] == "recovered":
            log.warning("job %s taken back from a vanished owner: %s", event[1], event[2])

    pool = SolverPool(settings, store=store, on_event=on_event)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    pool.start()
    log.info(
        "solver worker %s: %d processes on %s (%d of them for jobs of at most %g s)",
        pool.instance,
        pool.num_processes,
        _shown(settings.db),
        pool.short_processes,
        pool.short_budget_s,
    )
    try:
        stop.wait()
    finally:
        log.info("stopping: running solves get %.0f s", SHUTDOWN_GRACE_S)
        pool.stop(grace_s=SHUTDOWN_GRACE_S)
        store.close()
    return 0


def _shown(db: str) -> str:
    """The store's address without a password."""
    if "@" in db and "://" in db:
        scheme, rest = db.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        return f"{scheme}://{creds.split(':', 1)[0]}@{host}"
    return db

"""``skrull serve``: run the REST planning service (``api/``) on its job store (a SQLite file, or a shared
PostgreSQL database) with zero or more local solver processes.

Flags override ``SKRULL_*`` environment variables, which override the defaults (``api.settings``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skrull.solver.errors import RequestError

if TYPE_CHECKING:
    from skrull.api.settings import Settings

_FLAGS = {
    "host": "--host",
    "port": "--port",
    "db": "--db",
    "solver_processes": "--solver-processes",
    "log_level": "--log-level",
}


def add_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the REST planning service")
    p.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1; env SKRULL_HOST)")
    p.add_argument(
        "--port", type=int, default=None, help="TCP port (default 8000; 0 picks a free one; env SKRULL_PORT)"
    )
    p.add_argument(
        "--db",
        default=None,
        metavar="PATH|URL",
        help="job store: SQLite file (default skrull.db) or postgresql://user@host/db (env SKRULL_DB)",
    )
    p.add_argument(
        "--solver-processes",
        dest="solver_processes",
        type=int,
        default=None,
        help="local solver processes; 0 leaves solving to `skrull solver-worker` (default: one per CPU but one; "
        "env SKRULL_SOLVER_PROCESSES)",
    )
    # The former spelling: `--solvers` is the planner list of `skrull compare`, so here it only warns.
    p.add_argument("--solvers", dest="solvers_count", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--log-level", default=None, help="uvicorn log level (default info)")
    p.set_defaults(func=cmd_serve)


def settings_from_args(args: argparse.Namespace, flags: dict[str, str]) -> Settings:
    """Settings from the environment with the given command-line flags on top; a bad value is one
    ``RequestError`` naming the flag (or the ``SKRULL_*`` variable) it came from."""
    from pydantic import ValidationError

    from skrull.api.settings import Settings

    overrides = {key: getattr(args, key) for key in flags if getattr(args, key) is not None}
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = str(err["loc"][0]) if err["loc"] else "settings"
        raise RequestError(flags.get(key, f"SKRULL_{key.upper()}"), err.get("input"), str(err["msg"])) from None


def _check_bindable(host: str, port: int) -> None:
    """Refuse an address that is taken or not this machine's now, as one line (uvicorn would log and exit 1)."""
    import socket

    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(infos[0][4])
    except OSError as exc:
        raise RequestError("--port", port, f"cannot listen on {host}:{port} ({exc.strerror or exc})") from None


def cmd_serve(args: argparse.Namespace) -> int:
    from skrull.api.metrics_dir import metrics_directory  # imports no prometheus_client: it must come first

    if args.solvers_count is not None:
        print(
            "skrull: warning: `skrull serve --solvers N` is now --solver-processes N (--solvers is the planner list "
            "of `skrull compare`); taking it as --solver-processes this time",
            file=sys.stderr,
        )
        if args.solver_processes is None:
            args.solver_processes = args.solvers_count

    with metrics_directory():
        return _serve(args)


def check_db_folder(db: str) -> None:
    """A SQLite file's folder must exist: creating a mistyped path's folders would hide the mistake (the jobs
    land where nobody looks); a PostgreSQL URL is checked by connecting."""
    if "://" in db:
        return
    folder = Path(db).expanduser().parent
    if not folder.is_dir():
        raise RequestError("--db", db, f"the folder {str(folder)!r} does not exist; create it first, or fix the path")


def _serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from skrull.api.app import create_app
    except ImportError as exc:
        raise RequestError("serve", exc.name, "the service needs the api extra: pip install 'skrull[api]'") from None
    from skrull.api.server import raise_open_files_limit, uvicorn_options
    from skrull.api.store.open import StoreUnusableError, open_store

    settings = settings_from_args(args, _FLAGS)
    check_db_folder(settings.db)
    try:  # open (and migrate) the store now: a wrong URL or a damaged file is one clear line, not a traceback
        open_store(settings.db, pool_size=1).close()
    except StoreUnusableError as exc:
        raise RequestError("--db", settings.db, str(exc)) from None
    _check_bindable(settings.host, settings.port)
    raise_open_files_limit(settings)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        **uvicorn_options(settings),
    )
    return 0

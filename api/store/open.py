"""Choose the store backend from ``--db``: a ``postgresql://`` URL opens PostgreSQL, anything else is a
SQLite file path.

A store that cannot be used at all (an unreachable server, a file that is not a SQLite database or whose
schema pages are damaged, a schema newer than this release) is one ``StoreUnusableError`` whose message
names the store and how to recover, so ``skrull serve`` ends with one line instead of a traceback.
"""

from __future__ import annotations

import sqlite3

from skrull.api.store.base import JobStore, is_postgres_url
from skrull.api.store.migrations import SchemaTooNewError


class StoreUnusableError(RuntimeError):
    """The store cannot be opened; the message says which and what to do."""


def sqlite_recovery(path: str) -> str:
    return (
        f"stop every server using it, then restore {path} from a backup, or move it (and {path}-wal, {path}-shm) "
        f"aside to start with an empty store; rows can often be salvaged with "
        f"`sqlite3 {path} .recover | sqlite3 recovered.db`"
    )


def open_store(db: str, *, sqlite_synchronous: str = "NORMAL", pool_size: int = 8) -> JobStore:
    """The job store at ``db`` (migrated to the current schema)."""
    if is_postgres_url(db):
        from skrull.api.store.postgres import PostgresJobStore  # imported only where PostgreSQL is used

        try:
            return PostgresJobStore(db, pool_size=pool_size)
        except (ConnectionError, SchemaTooNewError) as exc:
            raise StoreUnusableError(str(exc)) from None
    from skrull.api.store.sqlite import SQLiteJobStore

    try:
        return SQLiteJobStore(db, synchronous=sqlite_synchronous)
    except SchemaTooNewError as exc:
        raise StoreUnusableError(f"{db}: {exc}") from None
    except sqlite3.OperationalError as exc:  # unreadable, locked for longer than busy_timeout, no such folder
        raise StoreUnusableError(f"{db}: cannot open the job store ({exc})") from None
    except sqlite3.DatabaseError as exc:  # not a database, or its schema pages are damaged
        raise StoreUnusableError(f"{db}: the job store is damaged ({exc}); {sqlite_recovery(db)}") from None
    except OSError as exc:
        raise StoreUnusableError(f"{db}: cannot open the job store ({exc.strerror or exc})") from None

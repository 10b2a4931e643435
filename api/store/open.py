"""Choose the store backend from ``--db``: a ``postgresql://`` URL opens PostgreSQL, anything else is a
SQLite file path."""

from __future__ import annotations

from skrull.api.store.base import JobStore


def is_postgres_url(db: str) -> bool:
    return db.startswith(("postgresql://", "postgres://"))


def open_store(db: str, *, sqlite_synchronous: str = "NORMAL", pool_size: int = 8) -> JobStore:
    """The job store at ``db`` (migrated to the current schema)."""
    if is_postgres_url(db):
        from skrull.api.store.postgres import PostgresJobStore  # imported only where PostgreSQL is used

        return PostgresJobStore(db, pool_size=pool_size)
    from skrull.api.store.sqlite import SQLiteJobStore

    return SQLiteJobStore(db, synchronous=sqlite_synchronous)

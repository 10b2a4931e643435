"""A real PostgreSQL server for tests: each test gets its own database (unique name), dropped afterwards.

The server is ``$SKRULL_TEST_PG`` (default ``postgresql://postgres@127.0.0.1:5432/postgres``, the local
server that ``.ci/run`` makes sure is running). Tests that need it skip, saying why, only when no
server answers there.
"""

from __future__ import annotations

import contextlib
import functools
import os
import uuid
from collections.abc import Iterator

import pytest

ADMIN_URL = os.environ.get("SKRULL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


@functools.cache
def unavailable_reason() -> str | None:
    """None when a PostgreSQL server answers at ``ADMIN_URL``, else why not."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install -e '.[api]')"
    try:
        with psycopg.connect(ADMIN_URL, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"no PostgreSQL server answers at {ADMIN_URL} ({str(exc).strip().splitlines()[0]})"
    return None


def require_postgres() -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)


def database_url(name: str) -> str:
    base, _, _ = ADMIN_URL.rpartition("/")
    return f"{base}/{name}"


@contextlib.contextmanager
def temporary_database() -> Iterator[str]:
    """A new empty database's URL; the database is dropped (connections closed by force) afterwards."""
    import psycopg

    require_postgres()
    name = f"skrull_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield database_url(name)
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

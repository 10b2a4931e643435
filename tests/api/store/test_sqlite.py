"""What only the SQLite backend does: WAL on a real file, and migrating files written before versioning."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from skrull.api.store.migrations import SchemaTooNewError
from skrull.api.store.sqlite import _SCHEMA_V1, SCHEMA_VERSION, SQLiteJobStore


def test_uses_write_ahead_logging_on_a_real_file(tmp_path: Path) -> None:
    store = SQLiteJobStore(tmp_path / "jobs.db")
    mode = store._conn().execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal" and store.path.is_file()
    store.close()


def test_a_file_from_before_schema_versions_is_migrated_and_keeps_its_jobs(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript(_SCHEMA_V1)
    conn.execute(
        "INSERT INTO jobs (id, status, solver, request, num_iterations, num_sequences, num_gpus, time_budget_s, "
        "created_at, updated_at) VALUES ('old', 'queued', 'skrull', '{}', 1, 1, 1, 1.0, 0, 0)"
    )
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    store = SQLiteJobStore(path)
    assert store.get("old") is not None and store.get("old").status == "queued"
    versions = store._conn().execute("SELECT version FROM schema_version").fetchall()
    assert [v for (v,) in versions] == list(range(1, SCHEMA_VERSION + 1))
    store.close()


def test_refuses_a_file_migrated_by_a_newer_release(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    SQLiteJobStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO schema_version VALUES (?, 'from the future', 0)", (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.close()
    with pytest.raises(SchemaTooNewError, match=f"version {SCHEMA_VERSION + 1}"):
        SQLiteJobStore(path)

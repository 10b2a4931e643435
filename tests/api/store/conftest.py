"""The store contract runs on every backend: a real SQLite file and a real PostgreSQL database."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from skrull.api.store.base import JobStore
from skrull.api.store.open import open_store
from tests.api.pg import temporary_database


@dataclass
class Backend:
    """Opens stores on one database (``open``); ``fresh`` moves to a new empty one."""

    name: str
    new_location: Callable[[], str]
    location: str = ""
    opened: list[JobStore] = field(default_factory=list)

    def open(self) -> JobStore:
        store = open_store(self.location, pool_size=4)
        self.opened.append(store)
        return store

    def fresh(self) -> JobStore:
        self.close()
        self.location = self.new_location()
        return self.open()

    def close(self) -> None:
        for store in self.opened:
            store.close()
        self.opened.clear()


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":

            def new_location() -> str:
                return str(tmp_path / f"jobs-{uuid.uuid4().hex[:8]}.db")

        else:

            def new_location() -> str:
                return stack.enter_context(temporary_database())

        b = Backend(name=request.param, new_location=new_location)
        b.location = new_location()
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def store(backend: Backend) -> JobStore:
    return backend.open()

"""Job stores: the ``JobStore`` interface and its backends."""

from skrull.api.store.base import JobStore
from skrull.api.store.sqlite import SQLiteJobStore

__all__ = ["JobStore", "SQLiteJobStore"]

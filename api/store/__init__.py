"""Job stores: the ``JobStore`` interface and its backends."""

from api.store.base import JobStore
from api.store.sqlite import SQLiteJobStore

__all__ = ["JobStore", "SQLiteJobStore"]

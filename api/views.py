"""Rank views (docs/formats.md "Rank view") rendered from stored iterations, cached in memory.

A solved iteration never changes, so a rendered view is cached by (plan, iteration, rank) and its ETag
is the iteration's digest plus the rank: a worker polling again gets 304 without a store read. Parsed
iterations and the request's lengths are cached too, so the first view of each rank costs one
``solver.worker_view.rank_view`` call. Iterations and requests are read with ``solver.io``, the same
readers every other part of the project uses, so a view is the library's view of the stored plan.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import OrderedDict
from typing import Generic, TypeVar

from skrull.api.store.base import IterationRecord, JobStore
from skrull.solver.io import iteration_from_dict, request_from_dict
from skrull.solver.types import Iteration, Parallel, Problem
from skrull.solver.worker_view import rank_view

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    """A thread-safe least-recently-used map holding at most ``capacity`` entries."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._data: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        if self.capacity <= 0:
            return
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.capacity:
                self._data.popitem(last=False)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RenderedView:
    etag: str
    body: bytes


def view_etag(record: IterationRecord, rank: int) -> str:
    return f'"{record.digest}.{rank}"'


class RankViews:
    def __init__(self, store: JobStore, *, max_views: int, max_jobs: int = 1024) -> None:
        self._store = store
        self._views: LRU[tuple[str, int, int], RenderedView] = LRU(max_views)
        self._iterations: LRU[tuple[str, int], Iteration] = LRU(max(16, max_views // 8))
        self._jobs: LRU[str, tuple[tuple[int, ...], Parallel]] = LRU(max_jobs)

    def cached(self, job_id: str, iteration: int, rank: int) -> RenderedView | None:
        return self._views.get((job_id, iteration, rank))

    def _job(self, job_id: str) -> tuple[tuple[int, ...], Parallel]:
        """The stored request's lengths by global sequence id and its layout (read with ``solver.io``)."""
        entry = self._jobs.get(job_id)
        if entry is None:
            text = self._store.request_json(job_id)
            assert text is not None, f"job {job_id} has iterations but no request"
            request = request_from_dict(json.loads(text))
            entry = (Problem.from_request(request).lengths, request.parallel)
            self._jobs.put(job_id, entry)
        return entry

    def iteration(self, record: IterationRecord) -> Iteration:
        """A stored iteration, read with ``solver.io.iteration_from_dict`` (cached)."""
        key = (record.job_id, record.index)
        it = self._iterations.get(key)
        if it is None:
            it = iteration_from_dict(json.loads(record.doc_json), field=f"iterations[{record.index}]")
            self._iterations.put(key, it)
        return it

    def render(self, record: IterationRecord, rank: int) -> RenderedView:
        """The view of ``rank`` in a stored iteration (blocking: store reads on a cache miss)."""
        key = (record.job_id, record.index, rank)
        hit = self._views.get(key)
        if hit is not None:
            return hit
        lengths, parallel = self._job(record.job_id)
        view = rank_view(self.iteration(record), lengths, parallel=parallel, rank=rank)
        body = json.dumps(view.to_dict(plan_id=record.job_id), separators=(",", ":")).encode()
        rendered = RenderedView(etag=view_etag(record, rank), body=body)
        self._views.put(key, rendered)
        return rendered

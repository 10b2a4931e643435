"""Rank views (docs/formats.md "Rank view") rendered from stored iterations, cached in memory.

A solved iteration never changes, so a rendered view is cached by (plan, iteration, rank) and its ETag
is the iteration's digest plus the rank: a worker polling again gets 304 without a store read. Parsed
iterations and the request's lengths are cached too, so the first view of each rank costs one
``solver.worker_view.rank_view`` call.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import OrderedDict
from typing import Generic, TypeVar

from skrull.api.schemas import iteration_from_document, rank_view_document
from skrull.api.store.base import IterationRecord, JobStore
from skrull.solver.types import Iteration, Parallel, Plan, SolveInfo
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
        self._jobs: LRU[str, tuple[tuple[int, ...], Parallel, int]] = LRU(max_jobs)

    def cached(self, job_id: str, iteration: int, rank: int) -> RenderedView | None:
        return self._views.get((job_id, iteration, rank))

    def _job(self, job_id: str) -> tuple[tuple[int, ...], Parallel, int]:
        entry = self._jobs.get(job_id)
        if entry is None:
            text = self._store.request_json(job_id)
            assert text is not None, f"job {job_id} has iterations but no request"
            doc = json.loads(text)
            lengths = tuple(n for batch in doc["batches"] for n in batch)
            bucket = doc.get("bucket_tokens") or doc["profile"]["memory"]["bucket_tokens"]
            entry = (lengths, Parallel(dp=doc["parallel"]["dp"], cp=doc["parallel"]["cp"]), int(bucket))
            self._jobs.put(job_id, entry)
        return entry

    def render(self, record: IterationRecord, rank: int) -> RenderedView:
        """The view of ``rank`` in a stored iteration (blocking: store reads on a cache miss)."""
        key = (record.job_id, record.index, rank)
        hit = self._views.get(key)
        if hit is not None:
            return hit
        lengths, parallel, bucket = self._job(record.job_id)
        it = self._iterations.get((record.job_id, record.index))
        if it is None:
            it = iteration_from_document(json.loads(record.doc_json))
            self._iterations.put((record.job_id, record.index), it)
        # rank_view reads plan.iterations[iteration]: a one-iteration plan at position 0, renumbered after.
        holder = Plan(
            solver="",
            parallel=parallel,
            bucket_tokens=bucket,
            iterations=(it,),
            pending=(),
            solve=SolveInfo(wall_ms=0.0, status="heuristic", objective_ms=it.estimated_ms),
        )
        view = dataclasses.replace(rank_view(holder, lengths, iteration=0, rank=rank), iteration=record.index)
        body = json.dumps(rank_view_document(view, plan_id=record.job_id), separators=(",", ":")).encode()
        rendered = RenderedView(etag=view_etag(record, rank), body=body)
        self._views.put(key, rendered)
        return rendered

"""Rank views (docs/formats.md "Rank view") rendered from stored iterations, cached in memory.

A solved iteration never changes, so a rendered view is cached by (plan, iteration, rank) and its ETag
is the iteration's digest plus the rank: a worker polling again gets 304 without a store read. Parsed
iterations and the request's lengths are cached too, so the first view of each rank costs one
``solver.worker_view.rank_view`` call. Iterations and requests are read with ``solver.io``, the same
readers every other part of the project uses, so a view is the library's view of the stored plan.

Memory is bounded in bytes: the three caches share ``cache_bytes`` (each entry weighed by its size: a
view's body, a parsed iteration by ``parsed_bytes``, ~40 bytes per request length),
and at most ``MAX_COLD_RENDERS`` views (plus ``MAX_LARGE_COLD_RENDERS`` of iterations over
``LARGE_ITERATION_BYTES``, which never take an ordinary slot) are built from the store at once, so a burst
of first fetches of large iterations cannot hold many parsed iterations at the same time, nor keep other
plans' first fetches waiting.

Output is bounded per answer: a view of more than ``max_view_tokens`` JSON tokens is served in pages of
whole microbatches (``?page=k``, 0-based); every page then carries ``page`` and ``pages``. A single
microbatch above the limit is refused (413 naming ``SKRULL_MAX_VIEW_TOKENS``).
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import OrderedDict
from typing import Any, Generic, TypeVar

from skrull.api.errors import ApiProblem
from skrull.api.sizes import DEFAULT_CACHE_BYTES, DEFAULT_MAX_VIEW_TOKENS, json_tokens
from skrull.api.store.base import DamagedRecordError, IterationRecord, JobStore
from skrull.solver.errors import RequestError
from skrull.solver.io import iteration_from_dict, request_from_dict
from skrull.solver.types import Iteration, Parallel, Problem
from skrull.solver.worker_view import rank_view

#: Views built from the store (cache misses) at the same time, per server process, of ordinary iterations
#: and of large ones (stored JSON over ``LARGE_ITERATION_BYTES``): large ones have their own slot, so a few
#: huge plans (CP 4,096 and wider) cannot hold every slot while other plans' first fetches time out.
MAX_COLD_RENDERS = 2
MAX_LARGE_COLD_RENDERS = 1
LARGE_ITERATION_BYTES = 1 << 20
#: Estimated bytes of Python objects per request length, per id or rank held in a parsed iteration, per
#: slot of a microbatch's ``local`` tuple (a pointer; an empty list reads as the one shared empty tuple) and
#: per microbatch object.
BYTES_PER_LENGTH = 40
BYTES_PER_ID = 36
BYTES_PER_SLOT = 8
BYTES_PER_MICROBATCH = 400


def parsed_bytes(it: Iteration) -> int:
    """Estimated memory of a parsed iteration (and the rank-view index built over it): ids, one local slot
    per GPU of each group, and each distinct ``ranks`` tuple once (``solver.io`` shares equal ones). A
    CP 4,096 plan of 202 all-sharded microbatches weighs ~7 MB, not 8x its 6.6 MB of JSON."""
    groups = {id(mb.ranks): len(mb.ranks) for mb in it.microbatches}
    slots = sum(len(mb.local) for mb in it.microbatches)
    ids = sum(len(mb.sharded) + sum(len(ids) for ids in mb.local if ids) for mb in it.microbatches)
    return (
        BYTES_PER_MICROBATCH * len(it.microbatches)
        + BYTES_PER_SLOT * 2 * slots  # the local tuples and the index's (microbatch, position) entries
        + BYTES_PER_ID * (ids + sum(groups.values()))
    )


K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    """A thread-safe least-recently-used map holding at most ``capacity`` entries and ``max_bytes`` bytes
    (each entry weighed by the ``size`` given to ``put``); an entry larger than the budget is not kept."""

    def __init__(self, capacity: int, *, max_bytes: int | None = None) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.bytes = 0
        self._data: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: K) -> V | None:
        with self._lock:
            entry = self._data.get(key)
            if entry is None:
                return None
            self._data.move_to_end(key)
            return entry[0]

    def put(self, key: K, value: V, *, size: int = 0) -> None:
        if self.capacity <= 0 or (self.max_bytes is not None and size > self.max_bytes):
            return
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            self._data[key] = (value, size)
            self.bytes += size
            while len(self._data) > self.capacity or (self.max_bytes is not None and self.bytes > self.max_bytes):
                _, (_, dropped) = self._data.popitem(last=False)
                self.bytes -= dropped

    def discard_where(self, keep: Any) -> None:
        """Drop every entry whose key ``keep(key)`` answers False for."""
        with self._lock:
            for key in [k for k in self._data if not keep(k)]:
                self.bytes -= self._data.pop(key)[1]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RenderedView:
    etag: str
    body: bytes


def view_etag(record: IterationRecord, rank: int) -> str:
    return f'"{record.digest}.{rank}"'


def view_too_large(tokens: int, limit: int, *, plan_id: str, iteration: int, rank: int) -> ApiProblem:
    return ApiProblem(
        status=413,
        slug="view-too-large",
        title="rank view too large",
        detail=f"one microbatch of rank {rank} in iteration {iteration} of plan {plan_id} has {tokens} JSON tokens; "
        f"at most {limit} are served per answer (SKRULL_MAX_VIEW_TOKENS)",
        limit=limit,
        tokens=tokens,
    )


class RankViews:
    def __init__(
        self,
        store: JobStore,
        *,
        max_views: int,
        max_jobs: int = 1024,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        max_view_tokens: int = DEFAULT_MAX_VIEW_TOKENS,
    ) -> None:
        self._store = store
        # The budget is split: half for rendered views, a quarter each for parsed iterations and lengths.
        self._views: LRU[tuple[str, int, int, int], RenderedView] = LRU(max_views, max_bytes=cache_bytes // 2)
        self._iterations: LRU[tuple[str, int], Iteration] = LRU(max(16, max_views // 8), max_bytes=cache_bytes // 4)
        self._jobs: LRU[str, tuple[tuple[int, ...], Parallel]] = LRU(max_jobs, max_bytes=cache_bytes // 4)
        self.max_view_tokens = max_view_tokens
        self._cold = threading.BoundedSemaphore(MAX_COLD_RENDERS)
        self._cold_large = threading.BoundedSemaphore(MAX_LARGE_COLD_RENDERS)
        #: Plans with anything cached (a superset: evicted entries are not removed), so ``forget`` is free
        #: for the many store changes of plans this replica holds nothing of.
        self._cached_jobs: set[str] = set()
        self._cached_lock = threading.Lock()
        #: The version (``created_at``) of each plan whose views were served from here: a plan deleted and
        #: submitted again under the same id is a new version, and what was cached of the old one is dropped.
        self._versions: dict[str, float] = {}

    @property
    def cached_bytes(self) -> int:
        return self._views.bytes + self._iterations.bytes + self._jobs.bytes

    def cached(self, job_id: str, iteration: int, rank: int, page: int = 0) -> RenderedView | None:
        return self._views.get((job_id, iteration, rank, page))

    def current(self, job_id: str, version: float) -> bool:
        """Whether what is cached of ``job_id`` belongs to the plan stored now (``version``: its
        ``created_at``); if not, it is dropped (False) and ``version`` becomes the current one."""
        with self._cached_lock:
            known = self._versions.get(job_id)
            if known == version:
                return True
            if len(self._versions) > 100_000:
                self._versions.clear()
            self._versions[job_id] = version
        if known is None:
            return True
        self.forget(job_id)
        return False

    def forget(self, job_id: str) -> None:
        """Drop everything cached of a plan that was deleted, expired, failed or changed (on any replica:
        ``Service.on_store_change``), so a plan resubmitted under the same id is never served the old views."""
        with self._cached_lock:
            if job_id not in self._cached_jobs:
                return
            self._cached_jobs.discard(job_id)
        self._views.discard_where(lambda k: k[0] != job_id)
        self._iterations.discard_where(lambda k: k[0] != job_id)
        self._jobs.discard_where(lambda k: k != job_id)

    def _remember(self, job_id: str) -> None:
        with self._cached_lock:
            self._cached_jobs.add(job_id)

    def _job(self, job_id: str) -> tuple[tuple[int, ...], Parallel]:
        """The stored request's lengths by global sequence id and its layout (read with ``solver.io``)."""
        entry = self._jobs.get(job_id)
        if entry is None:
            text = self._store.request_json(job_id)
            if text is None:
                raise DamagedRecordError(job_id, "it has iterations but no request")
            try:
                request = request_from_dict(json.loads(text))
            except (ValueError, KeyError, TypeError) as exc:
                raise DamagedRecordError(job_id, f"its request cannot be read ({type(exc).__name__}: {exc})") from None
            lengths = Problem.from_request(request).lengths
            entry = (lengths, request.parallel)
            self._jobs.put(job_id, entry, size=BYTES_PER_LENGTH * len(lengths))
        return entry

    def iteration(self, record: IterationRecord) -> Iteration:
        """A stored iteration, read with ``solver.io.iteration_from_dict`` (cached)."""
        key = (record.job_id, record.index)
        it = self._iterations.get(key)
        if it is None:
            try:
                it = iteration_from_dict(json.loads(record.doc_json), field=f"iterations[{record.index}]")
            except (ValueError, KeyError, TypeError) as exc:
                raise DamagedRecordError(
                    record.job_id, f"iteration {record.index} cannot be read ({type(exc).__name__}: {exc})"
                ) from None
            self._iterations.put(key, it, size=parsed_bytes(it))
        return it

    def render(self, record: IterationRecord, rank: int, page: int = 0) -> RenderedView:
        """Page ``page`` of the view of ``rank`` in a stored iteration (blocking: store reads on a cache miss).

        ``page`` past the last one is a ``RequestError`` naming the valid range (422)."""
        key = (record.job_id, record.index, rank, page)
        hit = self._views.get(key)
        if hit is not None:
            return hit
        with self._cold_large if len(record.doc_json) > LARGE_ITERATION_BYTES else self._cold:
            hit = self._views.get(key)  # rendered by another thread while this one waited
            if hit is not None:
                return hit
            return self._render(record, rank, page)

    def _render(self, record: IterationRecord, rank: int, page: int) -> RenderedView:
        self._remember(record.job_id)
        lengths, parallel = self._job(record.job_id)
        view = rank_view(self.iteration(record), lengths, parallel=parallel, rank=rank)
        body = view.to_json(plan_id=record.job_id)
        etag = view_etag(record, rank)
        if json_tokens(body) > self.max_view_tokens:
            return self._paged(record, rank, page, view.to_dict(plan_id=record.job_id))
        if page != 0:
            raise RequestError("page", page, "must be 0: this view has 1 page")
        rendered = RenderedView(etag=etag, body=body)
        self._views.put((record.job_id, record.index, rank, 0), rendered, size=len(body))
        return rendered

    def _paged(self, record: IterationRecord, rank: int, page: int, doc: dict[str, Any]) -> RenderedView:
        """Split the view's microbatches, in order, into pages of at most ``max_view_tokens`` tokens."""
        pages: list[list[dict[str, Any]]] = [[]]
        used = 0
        for mb in doc["microbatches"]:
            tokens = json_tokens(json.dumps(mb, separators=(",", ":")))
            if tokens > self.max_view_tokens:
                raise view_too_large(
                    tokens, self.max_view_tokens, plan_id=record.job_id, iteration=record.index, rank=rank
                )
            if pages[-1] and used + tokens > self.max_view_tokens:
                pages.append([])
                used = 0
            pages[-1].append(mb)
            used += tokens
        if not 0 <= page < len(pages):
            raise RequestError("page", page, f"must be in 0..{len(pages) - 1}: this view has {len(pages)} pages")
        out = {**doc, "microbatches": pages[page], "page": page, "pages": len(pages)}
        body = json.dumps(out, separators=(",", ":")).encode()
        rendered = RenderedView(etag=f'"{record.digest}.{rank}.p{page}"', body=body)
        self._views.put((record.job_id, record.index, rank, page), rendered, size=len(body))
        return rendered

"""Where the planned loader gets its plans: in this process (the library alone), or a planning service.
(Its default is a third source, the node's planner process: worker/planner_process.py.)

Both answer the same three calls, so ``PlannedBatches`` does not know which it has:

- ``submit(doc) -> plan_id``: start planning a request document (docs/formats.md "Request");
- ``rank_view(plan_id, rank, iteration, timeout_s=) -> dict``: GPU ``rank``'s part of one iteration, the
  rank view document the service serves (docs/formats.md "Rank view"), waiting until it is planned.

``LocalPlans`` plans with ``skrull.solver.solve`` on a background thread, ahead of use, and names a plan
by the content of its request (as the service does), so every rank of a job that submits the same
request computes the same plan, with no broadcast, as long as the plan is reproducible: the loader asks
for ``"deterministic": true`` by default (``auto`` then runs on a work clock and returns the same plan on
any machine, under any load: solver/search/clock.py). ``ServicePlans`` hands both calls to a
``skrull.api.client.PlanningClient`` (the service computes the plan once for all ranks).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any, Protocol

from skrull.solver.io import request_from_dict
from skrull.solver.planning import solve
from skrull.solver.types import Plan, Problem
from skrull.solver.worker_view import plan_rank_view

if TYPE_CHECKING:  # the client needs the api extra (httpx); a [worker] install plans locally
    from skrull.api.client import PlanningClient


class PlanSource(Protocol):
    def submit(self, doc: Mapping[str, Any]) -> str: ...

    def rank_view(self, plan_id: str, rank: int, iteration: int, *, timeout_s: float) -> dict[str, Any]: ...

    def plan(self, plan_id: str, *, timeout_s: float) -> Plan: ...

    def close(self) -> None: ...


def plan_key(doc: Mapping[str, Any]) -> str:
    """A request's content address: SHA-256 of its canonical JSON (sorted keys, no spaces), 32 hex digits."""
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


class LocalPlans:
    """Plans in this process, on ``threads`` background threads (module doc)."""

    def __init__(self, *, threads: int = 1) -> None:
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="skrull-plan")
        self._plans: dict[str, Future[tuple[Plan, tuple[int, ...]]]] = {}
        self._lock = threading.Lock()

    def submit(self, doc: Mapping[str, Any]) -> str:
        key = plan_key(doc)
        with self._lock:
            if key in self._plans:  # every rank, and a resumed loader, asks again for the same plan
                return key
        request = request_from_dict(dict(doc))  # a bad request fails here, in the caller, naming the field
        with self._lock:
            if key not in self._plans:
                self._plans[key] = self._pool.submit(lambda: (solve(request), Problem.from_request(request).lengths))
        return key

    def plan(self, plan_id: str, *, timeout_s: float | None = None) -> Plan:
        """The whole plan of ``plan_id`` (waiting for it)."""
        return self._result(plan_id, timeout_s)[0]

    def _result(self, plan_id: str, timeout_s: float | None) -> tuple[Plan, tuple[int, ...]]:
        with self._lock:
            future = self._plans.get(plan_id)
        if future is None:
            raise KeyError(f"plan {plan_id} was not submitted here")
        try:
            return future.result(timeout=timeout_s)
        except FutureTimeout:
            raise TimeoutError(f"plan {plan_id} not ready within {timeout_s} s") from None

    def rank_view(self, plan_id: str, rank: int, iteration: int, *, timeout_s: float = 300.0) -> dict[str, Any]:
        plan, lengths = self._result(plan_id, timeout_s)
        return plan_rank_view(plan, lengths, iteration=iteration, rank=rank).to_dict(plan_id=plan_id)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class ServicePlans:
    """Plans from a running ``skrull serve``, through its worker-side client."""

    def __init__(self, client: PlanningClient) -> None:
        self.client = client

    def submit(self, doc: Mapping[str, Any]) -> str:
        return self.client.submit(doc)

    def rank_view(self, plan_id: str, rank: int, iteration: int, *, timeout_s: float = 300.0) -> dict[str, Any]:
        return self.client.rank_view(plan_id, rank, iteration, timeout_s=timeout_s)

    def plan(self, plan_id: str, *, timeout_s: float = 300.0) -> Plan:
        return self.client.plan(plan_id, timeout_s=timeout_s)

    def close(self) -> None:
        """The client is the caller's: it stays open."""

"""The worker-side client of the planning service (httpx, synchronous, thread-safe).

A training job submits the lengths of upcoming global batches; each GPU's worker then fetches its own
part of every iteration, one or more iterations ahead, so the training loop never waits:

    with PlanningClient("http://planner:8000") as client:
        plan_id = client.submit(request_doc)
        for view in client.iter_rank_views(plan_id, rank=torch.distributed.get_rank()):
            run_iteration(view)          # iteration i+1 is fetched while this runs

Every call has a timeout. Transport errors and 429/502/503/504 answers are retried with exponential
backoff and full jitter (``sleep = uniform(0, min(max_backoff_s, backoff_s * 2**attempt))``, at least
the server's ``Retry-After``), so many workers polling one server do not retry in lockstep. Submitting
is safe to retry: the service names a plan by the content of its request. Rank views are cached by
ETag: asking again sends ``If-None-Match`` and a 304 answers from the cache.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx

from skrull.solver.io import plan_from_dict, request_to_dict
from skrull.solver.types import Plan, Request

RETRY_STATUSES = frozenset({429, 502, 503, 504})
#: The longest single long-poll the client asks for; longer waits are several polls.
LONG_POLL_CHUNK_S = 30.0


class ServiceUnreachableError(httpx.TransportError, ConnectionError):
    """Every attempt failed in transport (refused, reset, timed out): the message names the service's
    address. An ``httpx.TransportError`` and a ``ConnectionError``, so either kind of handler catches it."""


class ServiceError(Exception):
    """The service answered with a problem (``problem`` is the problem+json document)."""

    def __init__(self, status: int, problem: Mapping[str, Any]) -> None:
        self.status = status
        self.problem = dict(problem)
        super().__init__(f"{status}: {problem.get('detail') or problem.get('title') or 'error'}")

    @property
    def field(self) -> str | None:
        value = self.problem.get("field")
        return None if value is None else str(value)


class PlanFailedError(ServiceError):
    """The plan failed to solve; ``problem`` says why."""


class PlanningClient:
    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 10.0,
        retries: int = 5,
        backoff_s: float = 0.05,
        max_backoff_s: float = 2.0,
        cache_entries: int = 4096,
        transport: httpx.BaseTransport | None = None,
        seed: int | None = None,
        token: str | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        auth = {"Authorization": f"Bearer {token}"} if token else None  # SKRULL_SUBMIT_TOKENS / SKRULL_READ_TOKENS
        self.base_url = base_url
        self._http = httpx.Client(base_url=base_url, timeout=timeout_s, transport=transport, headers=auth)
        self._rng = random.Random(seed)
        self._cache: OrderedDict[str, tuple[str, dict[str, Any]]] = OrderedDict()
        self._cache_entries = cache_entries
        self._lock = threading.Lock()
        self.retried = 0

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PlanningClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- transport -------------------------------------------------------------------------------------

    def _delay_s(self, attempt: int, retry_after: str | None) -> float:
        with self._lock:
            delay = self._rng.uniform(0.0, min(self.max_backoff_s, self.backoff_s * 2**attempt))
        if retry_after is not None:
            with contextlib.suppress(ValueError):
                delay = max(delay, float(retry_after))
        return delay

    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> httpx.Response:
        timeout = self.timeout_s if timeout_s is None else timeout_s
        for attempt in range(self.retries + 1):
            try:
                response = self._http.request(method, path, json=json, params=params, headers=headers, timeout=timeout)
            except httpx.TransportError as exc:
                if attempt == self.retries:
                    reason = " ".join(str(exc).split()) or "no details"
                    raise ServiceUnreachableError(
                        f"cannot reach the planning service at {self.base_url} after {attempt + 1} attempt(s) "
                        f"({type(exc).__name__}: {reason})"
                    ) from exc
                self.retried += 1
                time.sleep(self._delay_s(attempt, None))
                continue
            if response.status_code in RETRY_STATUSES and attempt < self.retries:
                self.retried += 1
                time.sleep(self._delay_s(attempt, response.headers.get("retry-after")))
                continue
            return response
        raise AssertionError("unreachable: the last attempt returns or raises")

    @staticmethod
    def _raise_for_problem(response: httpx.Response, *, failed: bool = False) -> None:
        if response.status_code < 400:
            return
        try:
            problem = response.json()
        except ValueError:
            problem = {"title": response.reason_phrase, "detail": response.text[:200]}
        if not isinstance(problem, dict):
            problem = {"detail": str(problem)}
        raise (PlanFailedError if failed else ServiceError)(response.status_code, problem)

    # -- plans -----------------------------------------------------------------------------------------

    def submit(self, request: Mapping[str, Any] | Request, *, idempotency_key: str | None = None) -> str:
        """Submit a request (a request document (docs/formats.md) or a ``solver.types.Request``); the plan id."""
        doc = request_to_dict(request, inline_profile=True) if isinstance(request, Request) else dict(request)
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        response = self._request("POST", "/v1/plans", json=doc, headers=headers)
        self._raise_for_problem(response)
        return str(response.json()["id"])

    def get(self, plan_id: str, *, wait_s: float = 0.0, until_final: bool = False) -> dict[str, Any]:
        """The plan's envelope; with ``wait_s`` the server answers as soon as status or progress changes
        (with ``until_final``: once the plan is solved or failed)."""
        params: dict[str, Any] | None = None
        if wait_s > 0:
            params = {"wait": wait_s, "until": "final"} if until_final else {"wait": wait_s}
        response = self._request("GET", f"/v1/plans/{plan_id}", params=params, timeout_s=self.timeout_s + wait_s)
        self._raise_for_problem(response)
        envelope: dict[str, Any] = response.json()
        return envelope

    def wait(self, plan_id: str, *, timeout_s: float = 60.0) -> dict[str, Any]:
        """Long-poll until the plan is solved: its envelope. ``PlanFailedError`` if it failed,
        ``TimeoutError`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            envelope = self.get(plan_id, wait_s=max(0.0, min(LONG_POLL_CHUNK_S, remaining)), until_final=True)
            if envelope["status"] == "solved":
                return envelope
            if envelope["status"] == "failed":
                raise PlanFailedError(409, envelope.get("error") or {"detail": "failed"})
            if deadline - time.monotonic() <= 0:
                raise TimeoutError(f"plan {plan_id} not solved within {timeout_s} s (status {envelope['status']})")

    def plan(self, plan_id: str, *, timeout_s: float = 60.0) -> Plan:
        """Wait for the plan and convert it to the solver's ``Plan``."""
        return plan_from_dict(self.wait(plan_id, timeout_s=timeout_s)["plan"])

    def submit_and_wait(self, request: Mapping[str, Any] | Request, *, timeout_s: float = 60.0) -> dict[str, Any]:
        return self.wait(self.submit(request), timeout_s=timeout_s)

    # -- rank views ------------------------------------------------------------------------------------

    def rank_view(self, plan_id: str, rank: int, iteration: int, *, timeout_s: float = 60.0) -> dict[str, Any]:
        """GPU ``rank``'s part of ``iteration``, waiting (long-polls) until that iteration is solved.

        ``ServiceError`` (404) for an unknown plan, rank or iteration (the problem names the valid range);
        ``PlanFailedError`` if the plan failed; ``TimeoutError`` after ``timeout_s``.
        """
        path = f"/v1/plans/{plan_id}/ranks/{rank}"
        key = f"{path}?iteration={iteration}"
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                cached = self._cache.get(key)
            headers = {"If-None-Match": cached[0]} if cached else None
            wait_s = max(0.0, min(LONG_POLL_CHUNK_S, deadline - time.monotonic()))
            response = self._request(
                "GET",
                path,
                params={"iteration": iteration, "wait": wait_s},
                headers=headers,
                timeout_s=self.timeout_s + wait_s,
            )
            if response.status_code == 304 and cached is not None:
                return cached[1]
            if response.status_code == 200:
                view: dict[str, Any] = response.json()
                if view.get("pages", 1) > 1:
                    view = self._remaining_pages(path, iteration, view)
                etag = response.headers.get("etag")
                if etag:
                    self._remember(key, etag, view)
                return view
            if response.status_code == 202:
                if deadline - time.monotonic() <= 0:
                    raise TimeoutError(f"iteration {iteration} of plan {plan_id} not solved within {timeout_s} s")
                continue
            self._raise_for_problem(response, failed=response.status_code == 409)
            raise ServiceError(response.status_code, {"detail": f"unexpected answer {response.status_code}"})

    def _remaining_pages(self, path: str, iteration: int, first: dict[str, Any]) -> dict[str, Any]:
        """A view the service serves in pages (longer than its SKRULL_MAX_VIEW_TOKENS): all of them, joined."""
        microbatches = list(first["microbatches"])
        for page in range(1, int(first["pages"])):
            response = self._request("GET", path, params={"iteration": iteration, "page": page})
            self._raise_for_problem(response)
            microbatches.extend(response.json()["microbatches"])
        view = {k: v for k, v in first.items() if k not in ("page", "pages")}
        view["microbatches"] = microbatches
        return view

    def _remember(self, key: str, etag: str, view: dict[str, Any]) -> None:
        with self._lock:
            self._cache[key] = (etag, view)
            self._cache.move_to_end(key)
            while len(self._cache) > self._cache_entries:
                self._cache.popitem(last=False)

    def iter_rank_views(
        self,
        plan_id: str,
        rank: int,
        *,
        iterations: Iterable[int] | None = None,
        prefetch: int = 1,
        timeout_s: float = 300.0,
    ) -> Iterator[dict[str, Any]]:
        """GPU ``rank``'s views of ``iterations`` (default: all of the plan's), in order, fetching up to
        ``prefetch`` iterations ahead in a background thread while the caller runs the current one."""
        if iterations is None:
            iterations = range(self.get(plan_id)["progress"]["iterations_total"])
        todo = deque(iterations)
        ahead = max(1, prefetch)
        pool = ThreadPoolExecutor(max_workers=ahead + 1, thread_name_prefix="skrull-prefetch")
        in_flight: deque[Future[dict[str, Any]]] = deque()
        try:
            while todo or in_flight:
                # Keep the current iteration and ``ahead`` more in flight; while the caller runs iteration i,
                # iterations i+1..i+ahead are being fetched.
                while todo and len(in_flight) < ahead + 1:
                    in_flight.append(pool.submit(self.rank_view, plan_id, rank, todo.popleft(), timeout_s=timeout_s))
                yield in_flight.popleft().result()
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

"""Where ``POST /v1/compare`` runs: a fixed number of compare processes, bounded waiting, a hard deadline.

A compare runs every planner it is asked for (the exact ones included) on one request, so it may take a
while; it never runs on the event loop or in the plan solver pool. What keeps it from blocking other
requests, or other compares:

* ``compare_processes`` slots, each one single-process executor. A compare waits for a free slot; at
  most ``max_queued_compares`` may wait, and any beyond get 503 with ``Retry-After`` at once, instead of
  a 504 after waiting behind slow ones.
* The deadline counts from when the compare got its slot, not from when it arrived. A compare past it
  answers 504 and its process is killed and replaced, so the slot is free for the next at once.
* A tenant may have at most ``tenant_max_compares`` compares running or waiting (beyond: 429
  ``quota-exceeded``), so one team's compares cannot take every slot and every waiting place.
* A compare whose client disconnects stops: it leaves the waiting line, or its process is killed and
  replaced, so an abandoned compare holds nothing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import multiprocessing
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from skrull.api.errors import ApiProblem

T = TypeVar("T")


class ClientGone(ApiProblem):
    """The compare's client disconnected; the compare was stopped (499, which nobody reads but the logs)."""

    def __init__(self) -> None:
        super().__init__(
            status=499, slug="client-closed", title="client closed the request", detail="the compare was stopped"
        )


class ServerStopping(ApiProblem):
    """The server is stopping (SIGTERM); the compare was stopped."""

    def __init__(self) -> None:
        super().__init__(
            status=503,
            slug="server-stopping",
            title="server stopping",
            detail="the server is stopping; the compare was stopped: retry against a running server",
            headers={"Retry-After": "5"},
        )


class ComparePool:
    def __init__(self, *, processes: int, max_waiting: int, initializer: Callable[..., None], initargs: Sequence[Any]):
        self._processes = processes
        self._max_waiting = max_waiting
        self._initializer = initializer
        self._initargs = tuple(initargs)
        self._slots: list[concurrent.futures.ProcessPoolExecutor | None] = [None] * processes
        self._free: asyncio.Queue[int] | None = None
        self.waiting = 0
        self.running = 0
        #: compares running or waiting, by tenant
        self.by_tenant: dict[str, int] = {}
        self._stopping: asyncio.Event | None = None

    def _executor(self, slot: int) -> concurrent.futures.ProcessPoolExecutor:
        executor = self._slots[slot]
        if executor is None:
            executor = concurrent.futures.ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=self._initializer,
                initargs=self._initargs,
            )
            self._slots[slot] = executor
        return executor

    def _kill(self, slot: int) -> None:
        """Kill the slot's process (a compare past its deadline) and drop its executor."""
        executor = self._slots[slot]
        self._slots[slot] = None
        if executor is None:
            return
        for process in list(getattr(executor, "_processes", {}).values()):
            with contextlib.suppress(Exception):
                process.kill()
        executor.shutdown(wait=False, cancel_futures=True)

    async def run(
        self,
        timeout_s: float,
        fn: Callable[..., T],
        *args: Any,
        tenant: str = "",
        max_per_tenant: int | None = None,
        client_gone: Callable[[], Awaitable[None]] | None = None,
    ) -> T:
        """``fn(*args)`` in a compare process. ``client_gone`` returns when the client has disconnected: the
        compare then stops (out of the waiting line, or its process killed) and answers 499."""
        held = self.by_tenant.get(tenant, 0)
        if max_per_tenant is not None and held >= max_per_tenant:
            raise ApiProblem(
                status=429,
                slug="quota-exceeded",
                title="tenant quota exceeded",
                detail=f"this tenant has {held} compares running or waiting, its limit "
                f"(SKRULL_TENANT_MAX_COMPARES = {max_per_tenant}); retry when one has finished",
                headers={"Retry-After": "5"},
                field="SKRULL_TENANT_MAX_COMPARES",
                value=held,
                limit=max_per_tenant,
            )
        self.by_tenant[tenant] = held + 1
        gone: asyncio.Task[None] | None = asyncio.ensure_future(client_gone()) if client_gone is not None else None
        try:
            return await self._run(timeout_s, fn, args, gone)
        finally:
            if gone is not None:
                gone.cancel()
            left = self.by_tenant[tenant] - 1
            if left:
                self.by_tenant[tenant] = left
            else:
                del self.by_tenant[tenant]

    async def _race(self, work: Awaitable[T], gone: asyncio.Task[None] | None) -> T:
        """``work``, unless the client goes first (``ClientGone``) or the server stops (``ServerStopping``)."""
        task = asyncio.ensure_future(work)
        stopping = asyncio.ensure_future(self._stopping_event().wait())
        others = {stopping} if gone is None else {stopping, gone}
        try:
            done, _ = await asyncio.wait({task, *others}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if task in done and not self._stopping_event().is_set():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        if self._stopping_event().is_set():
            raise ServerStopping()
        raise ClientGone()

    def _stopping_event(self) -> asyncio.Event:
        if self._stopping is None:
            self._stopping = asyncio.Event()
        return self._stopping

    def stop_running(self) -> None:
        """The server is stopping (SIGTERM): every compare, running or waiting, stops now and answers 503
        ``server-stopping``; running ones' processes are killed. Called on the event loop."""
        self._stopping_event().set()
        for slot in range(self._processes):
            if self._slots[slot] is not None and self.running:
                self._kill(slot)

    async def _run(
        self, timeout_s: float, fn: Callable[..., T], args: tuple[Any, ...], gone: asyncio.Task[None] | None
    ) -> T:
        if self._free is None:
            self._free = asyncio.Queue()
            for slot in range(self._processes):
                self._free.put_nowait(slot)
        if self._stopping_event().is_set():
            raise ServerStopping()
        if self._free.empty() and self.waiting >= self._max_waiting:
            raise ApiProblem(
                status=503,
                slug="compare-queue-full",
                title="compare queue full",
                detail=f"{self.running} compares are running and {self.waiting} waiting "
                f"(SKRULL_COMPARE_PROCESSES, SKRULL_MAX_QUEUED_COMPARES); retry later",
                headers={"Retry-After": "5"},
            )
        self.waiting += 1
        free = self._free
        try:
            slot = await self._race(free.get(), gone)
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            future = self._executor(slot).submit(fn, *args)
            try:
                return await self._race(asyncio.wait_for(asyncio.wrap_future(future), timeout_s), gone)
            except ClientGone:
                self._kill(slot)  # nobody waits for this answer: stop the planners now
                raise
            except TimeoutError:
                self._kill(slot)
                raise ApiProblem(
                    status=504,
                    slug="compare-timeout",
                    title="compare timed out",
                    detail=f"the planners did not finish within {timeout_s:.1f} s; the compare was stopped",
                ) from None
            except concurrent.futures.BrokenExecutor:
                self._kill(slot)
                raise ApiProblem(
                    status=503,
                    slug="compare-failed",
                    title="compare process died",
                    detail="the compare process died (out of memory?); retry with fewer sequences or solvers",
                    headers={"Retry-After": "1"},
                ) from None
        finally:
            self.running -= 1
            self._free.put_nowait(slot)

    def close(self) -> None:
        """Stop every compare process and wait for it to exit. An idle one exits at once and releases what
        its planners registered with multiprocessing's resource tracker (semaphores of the exact solvers'
        child processes); not waiting left them to the tracker, which warned of leaked semaphores at exit.
        A compare still running at shutdown is killed first (its client has gone with the server)."""
        for slot, executor in enumerate(self._slots):
            if executor is None:
                continue
            if self.running:
                for process in list(getattr(executor, "_processes", {}).values()):
                    with contextlib.suppress(Exception):
                        process.kill()
            executor.shutdown(wait=True, cancel_futures=True)
            self._slots[slot] = None

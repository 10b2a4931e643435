"""Where ``POST /v1/compare`` runs: a fixed number of compare processes, bounded waiting, a hard deadline.

A compare runs every planner it is asked for (the exact ones included) on one request, so it may take a
while; it never runs on the event loop or in the plan solver pool. What keeps it from blocking other
requests, or other compares:

* ``compare_processes`` slots, each one single-process executor. A compare waits for a free slot; at
  most ``max_queued_compares`` may wait, and any beyond get 503 with ``Retry-After`` at once, instead of
  a 504 after waiting behind slow ones.
* Slots are shared between tenants: one tenant runs at most ``running_share`` compares at once (half the
  slots, at least one), and a freed slot goes to the waiting compare of the tenant running the fewest
  (the oldest of those), not to the oldest overall. With two slots (the default), a tenant's compare
  never waits behind another single tenant's compares.
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
        self._free: list[int] = list(range(processes))
        #: compares waiting for a slot, oldest first: (tenant, the future its slot is handed through)
        self._waiters: list[tuple[str, asyncio.Future[int]]] = []
        #: compares one tenant may run at once: half the slots, at least one
        self.running_share = max(1, processes // 2)
        #: compares running, by tenant
        self.running_by_tenant: dict[str, int] = {}
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
            return await self._run(timeout_s, fn, args, gone, tenant)
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

    def _take(self, tenant: str) -> int:
        self.running_by_tenant[tenant] = self.running_by_tenant.get(tenant, 0) + 1
        return self._free.pop(0)

    def _give_back(self, slot: int, tenant: str) -> None:
        left = self.running_by_tenant.get(tenant, 1) - 1
        if left > 0:
            self.running_by_tenant[tenant] = left
        else:
            self.running_by_tenant.pop(tenant, None)
        self._free.append(slot)
        self._dispatch()

    def _dispatch(self) -> None:
        """Hand free slots to waiting compares: the tenant running the fewest (under its share) first, then
        the oldest."""
        while self._free:
            best: tuple[int, int] | None = None
            for k, (tenant, future) in enumerate(self._waiters):
                running = self.running_by_tenant.get(tenant, 0)
                if not future.done() and running < self.running_share and (best is None or running < best[0]):
                    best = (running, k)
            if best is None:
                return
            tenant, future = self._waiters.pop(best[1])
            future.set_result(self._take(tenant))

    async def _acquire(self, tenant: str, gone: asyncio.Task[None] | None) -> int:
        if self._stopping_event().is_set():
            raise ServerStopping()
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        entry = (tenant, future)
        self._waiters.append(entry)
        self._dispatch()
        if future.done():  # a slot was free for this tenant
            return future.result()
        if self.waiting >= self._max_waiting:
            self._waiters.remove(entry)
            raise ApiProblem(
                status=503,
                slug="compare-queue-full",
                title="compare queue full",
                detail=f"{self.running} compares are running and {self.waiting} waiting "
                f"(SKRULL_COMPARE_PROCESSES, SKRULL_MAX_QUEUED_COMPARES); retry later",
                headers={"Retry-After": "5"},
            )
        self.waiting += 1
        try:
            return await self._race(future, gone)
        except BaseException:
            if entry in self._waiters:
                self._waiters.remove(entry)
            if future.done() and not future.cancelled():  # a slot was handed over as the caller left
                self._give_back(future.result(), tenant)
            raise
        finally:
            self.waiting -= 1

    async def _run(
        self,
        timeout_s: float,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        gone: asyncio.Task[None] | None,
        tenant: str = "",
    ) -> T:
        slot = await self._acquire(tenant, gone)
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
            self._give_back(slot, tenant)

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

"""Where ``POST /v1/compare`` runs: a fixed number of compare processes, bounded waiting, a hard deadline.

A compare runs every planner it is asked for (the exact ones included) on one request, so it may take a
while; it never runs on the event loop or in the plan solver pool. What keeps it from blocking other
requests, or other compares:

* ``compare_processes`` slots, each one single-process executor. A compare waits for a free slot; at
  most ``max_queued_compares`` may wait, and any beyond get 503 with ``Retry-After`` at once, instead of
  a 504 after waiting behind slow ones.
* The deadline counts from when the compare got its slot, not from when it arrived. A compare past it
  answers 504 and its process is killed and replaced, so the slot is free for the next at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import multiprocessing
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from skrull.api.errors import ApiProblem

T = TypeVar("T")


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

    async def run(self, timeout_s: float, fn: Callable[..., T], *args: Any) -> T:
        if self._free is None:
            self._free = asyncio.Queue()
            for slot in range(self._processes):
                self._free.put_nowait(slot)
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
        try:
            slot = await self._free.get()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            future = self._executor(slot).submit(fn, *args)
            try:
                return await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
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

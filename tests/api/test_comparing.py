"""Compares wait boundedly for their processes, and one past its deadline is killed so the next starts
at once (real spawned processes)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from skrull.api.comparing import ComparePool
from skrull.api.errors import ApiProblem
from skrull.api.solving import import_plugins


@pytest.fixture
def pool() -> Iterator[ComparePool]:
    p = ComparePool(processes=1, max_waiting=1, initializer=import_plugins, initargs=((),))
    yield p
    p.close()


def test_a_compare_past_its_deadline_is_killed_and_the_next_starts_at_once(pool: ComparePool) -> None:
    async def scenario() -> tuple[ApiProblem, float, float]:
        await pool.run(30, time.sleep, 0)  # start the process once
        start = time.monotonic()
        with pytest.raises(ApiProblem) as err:
            await pool.run(0.5, time.sleep, 60)
        timed_out_after = time.monotonic() - start
        start = time.monotonic()
        await pool.run(30, time.sleep, 0.01)
        return err.value, timed_out_after, time.monotonic() - start

    problem, timed_out_after, next_took = asyncio.run(scenario())
    assert problem.status == 504 and problem.slug == "compare-timeout"
    assert timed_out_after < 30.0  # killed at its 0.5 s deadline, not after its 60 s sleep, under any load
    assert next_took < 15.0  # a fresh process (spawn + imports), not the 60 s sleep of the killed one


def test_compares_beyond_the_waiting_bound_are_refused_at_once(pool: ComparePool) -> None:
    async def scenario() -> tuple[list[object], float]:
        await pool.run(30, time.sleep, 0)
        running = asyncio.create_task(pool.run(30, time.sleep, 1.0))
        await asyncio.sleep(0.1)
        waiting = asyncio.create_task(pool.run(30, time.sleep, 0))
        await asyncio.sleep(0.1)
        start = time.monotonic()
        with pytest.raises(ApiProblem) as err:
            await pool.run(30, time.sleep, 0)
        refused_after = time.monotonic() - start
        results = await asyncio.gather(running, waiting)
        assert err.value.status == 503 and err.value.headers["Retry-After"]
        return list(results), refused_after

    results, refused_after = asyncio.run(scenario())
    assert results == [None, None]  # the running and the waiting compare both finished
    assert refused_after < 0.5

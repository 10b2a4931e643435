"""Compares wait boundedly for their processes, and one past its deadline is killed so the next starts
at once (real spawned processes)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from skrull.api.errors import ApiProblem
from skrull.api.solvers.compare_pool import ClientGone, ComparePool
from skrull.api.solvers.pool import import_plugins


@pytest.fixture
def pool() -> Iterator[ComparePool]:
    p = ComparePool(processes=1, max_waiting=1, initializer=import_plugins, initargs=((),))
    yield p
    p.close()


#: Bounds only a hung pool exceeds: a fresh compare process (spawn + imports) on a loaded machine takes seconds.
HUNG_S = 120.0


def _ended(pid: int) -> bool:
    """The process is gone or a zombie (killed, not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_a_compare_past_its_deadline_is_killed_and_the_next_starts_at_once(pool: ComparePool) -> None:
    async def scenario() -> tuple[int, ApiProblem, float, int]:
        first_pid = await pool.run(HUNG_S, os.getpid)  # start the process once
        start = time.monotonic()
        with pytest.raises(ApiProblem) as err:
            await pool.run(0.5, time.sleep, 600)
        timed_out_after = time.monotonic() - start
        next_pid = await pool.run(HUNG_S, os.getpid)
        return first_pid, err.value, timed_out_after, next_pid

    first_pid, problem, timed_out_after, next_pid = asyncio.run(scenario())
    assert problem.status == 504 and problem.slug == "compare-timeout"
    assert timed_out_after < HUNG_S  # at its 0.5 s deadline, not after its 600 s sleep, under any load
    # The next compare ran in a new process (not behind the 600 s sleep), and the late one's was killed.
    assert next_pid != first_pid
    deadline = time.monotonic() + HUNG_S
    while not _ended(first_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _ended(first_pid)


def _hold_until(path: str) -> None:
    """A compare that holds its slot until the test creates ``path`` (bounded by HUNG_S)."""
    deadline = time.monotonic() + HUNG_S
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.005)


def test_compares_beyond_the_waiting_bound_are_refused_at_once(pool: ComparePool, tmp_path: Path) -> None:
    release = tmp_path / "release"

    async def scenario() -> tuple[list[object], bool]:
        await pool.run(HUNG_S, time.sleep, 0)
        running = asyncio.create_task(pool.run(HUNG_S, _hold_until, str(release)))  # holds the only slot
        await _until(lambda: pool.running == 1)
        waiting = asyncio.create_task(pool.run(HUNG_S, time.sleep, 0))
        await _until(lambda: pool.waiting == 1)
        with pytest.raises(ApiProblem) as err:
            await pool.run(HUNG_S, time.sleep, 0)
        held_meanwhile = not running.done()  # refused while the slot was still held: not queued behind it
        release.touch()
        results = await asyncio.gather(running, waiting)
        assert err.value.status == 503 and err.value.headers["Retry-After"]
        return list(results), held_meanwhile

    results, held_meanwhile = asyncio.run(scenario())
    assert results == [None, None]  # the running and the waiting compare both finished
    assert held_meanwhile


def test_a_tenant_holds_at_most_its_share_of_compares(pool: ComparePool) -> None:
    """team-b's compares beyond SKRULL_TENANT_MAX_COMPARES are 429 at once; team-a still gets a place
    (before: five team-b compares made every other compare 503)."""

    async def scenario() -> tuple[ApiProblem, object]:
        await pool.run(30, time.sleep, 0)
        running = asyncio.create_task(pool.run(30, time.sleep, 0.5, tenant="b", max_per_tenant=1))
        await asyncio.sleep(0.1)
        with pytest.raises(ApiProblem) as err:
            await pool.run(30, time.sleep, 0, tenant="b", max_per_tenant=1)
        other = await pool.run(30, time.sleep, 0, tenant="a", max_per_tenant=1)
        await running
        return err.value, other

    problem, other = asyncio.run(scenario())
    assert problem.status == 429 and problem.slug == "quota-exceeded"
    assert other is None
    assert pool.by_tenant == {}


def test_a_compare_whose_client_left_is_stopped(pool: ComparePool) -> None:
    """The running compare's process is killed and the waiting one leaves the line (before: both held the
    pool until their planners finished, 30 s after their clients had gone)."""

    async def scenario() -> tuple[list[BaseException | None], int]:
        await pool.run(30, time.sleep, 0)

        async def gone_soon() -> None:
            await asyncio.sleep(0.3)

        running = asyncio.create_task(pool.run(120, time.sleep, 60, client_gone=gone_soon))
        await asyncio.sleep(0.05)
        waiting = asyncio.create_task(pool.run(120, time.sleep, 60, client_gone=gone_soon))
        outcomes = await asyncio.gather(running, waiting, return_exceptions=True)
        await pool.run(60, time.sleep, 0)  # the slot is free again: a fresh process, not the 60 s sleep
        return [o if isinstance(o, BaseException) else None for o in outcomes], pool.waiting

    outcomes, waiting = asyncio.run(scenario())
    assert all(isinstance(o, ClientGone) for o in outcomes), outcomes
    assert waiting == 0

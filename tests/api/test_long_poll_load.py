"""Many concurrent long-polls against a real server each answer when their wait ends, with the plan's
state. How close to the deadline they answer depends on the machine's load, so the promise (within
``wait + 0.5 s`` at 1,000 concurrent) is measured by bench/long_poll.py; here a poll must not answer
before its wait, and must answer at all (``HANG_S``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.api.conftest import LiveServer, plan_request

WAIT_S = 1.0
WAITERS = 300
#: A long-poll still unanswered this long after its wait hangs: no load on a working server explains it.
HANG_S = 30.0


async def _long_poll(host: str, port: int, path: str) -> float:
    """One long-poll over a raw connection (a minimal client, so the figure is the server's): the time from
    the request's last byte to the answer's last byte."""
    reader, writer = await asyncio.open_connection(host, port)
    request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
    begin = time.monotonic()
    writer.write(request)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), WAIT_S + HANG_S)
    elapsed = time.monotonic() - begin
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200") and b'"status":"queued"' in answer.replace(b" ", b""), answer[:200]
    return elapsed


async def _long_polls(url: str, plan_ids: list[str], waiters: int) -> list[float]:
    parsed = httpx.URL(url)
    host, port = parsed.host, parsed.port or 80
    paths = [f"/v1/plans/{plan_ids[k % len(plan_ids)]}?wait={WAIT_S}" for k in range(waiters)]
    return list(await asyncio.gather(*(_long_poll(host, port, p) for p in paths)))


def test_concurrent_long_polls_answer_within_their_deadline(
    live_server_factory: Callable[..., LiveServer], tmp_path: Path
) -> None:
    server = live_server_factory(tmp_path / "s.db", solver_processes=0).start()  # nothing is solved: all wait
    plan_ids = [
        httpx.post(f"{server.url}/v1/plans", json=plan_request([[10 + k, 20]], dp=1, cp=2)).json()["id"]
        for k in range(3)
    ]
    elapsed = asyncio.run(_long_polls(server.url, plan_ids, WAITERS))
    assert len(elapsed) == WAITERS
    assert min(elapsed) >= WAIT_S - 0.05, "a long-poll answered before its wait ended, with nothing changed"
    assert max(elapsed) <= WAIT_S + HANG_S, f"a long-poll hung {max(elapsed) - WAIT_S:.1f} s past its wait"

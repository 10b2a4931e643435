"""Wake-ups for long-polls inside one server process.

A handler opens a ``listen(key)`` *before* it reads the store and awaits it only if nothing it wants
is there yet, so a change that lands between the read and the wait is never missed. Solver processes
report job events to the server (``api.solvers.pool``), which calls ``notify`` on the event loop. A
long-poll also re-reads the store every ``recheck_s`` in case a change came from elsewhere (another
server on the same store).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager


class Listener:
    def __init__(self) -> None:
        self.event = asyncio.Event()

    async def wait(self, timeout_s: float) -> bool:
        """True when notified, False on timeout."""
        if timeout_s <= 0:
            return self.event.is_set()
        try:
            await asyncio.wait_for(self.event.wait(), timeout_s)
        except TimeoutError:
            return False
        return True


class Notifier:
    """Per-key sets of listeners; ``notify`` must run on the event loop's thread."""

    def __init__(self) -> None:
        self._listeners: dict[str, set[Listener]] = {}

    @contextmanager
    def listen(self, key: str) -> Iterator[Listener]:
        listener = Listener()
        self._listeners.setdefault(key, set()).add(listener)
        try:
            yield listener
        finally:
            group = self._listeners.get(key)
            if group is not None:
                group.discard(listener)
                if not group:
                    del self._listeners[key]

    def notify(self, key: str) -> None:
        for listener in self._listeners.get(key, ()):
            listener.event.set()

    def notify_all(self) -> None:
        for group in self._listeners.values():
            for listener in group:
                listener.event.set()

"""Running the app under uvicorn with connection limits and read timeouts (``skrull serve``).

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) and refuses connections beyond
``limit_concurrency`` with 503, but it sets no deadline on reading a request: a client that sends half
its headers, or a body one byte a minute, holds its connection (and a file descriptor, and a
``limit_concurrency`` slot) for as long as it likes. ``ReadTimeoutH11`` adds that deadline: from the
moment a connection opens, and again from the first byte of every following request on it, the whole
request (line, headers and body) must arrive within ``request_read_timeout_s``, else the connection is
closed (a handler waiting for the body sees a disconnect). Writing the answer is not limited here:
long-polls answer when they answer.

``h11_max_incomplete_event_size`` bounds the request line plus headers (``max_header_bytes``); bodies
are bounded by ``BodySizeLimit``.
"""

from __future__ import annotations

import asyncio
import resource
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from skrull.api.settings import Settings

_RECEIVED = (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR)
#: Files the server holds besides its connections (store, solver processes' pipes, logs, the listener).
OTHER_FILES = 512


class ReadTimeoutH11(H11Protocol):
    """uvicorn's h11 protocol with a deadline on reading each request (``read_timeout_s``)."""

    read_timeout_s: float = 15.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_deadline: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        if self._read_deadline is None:
            self._read_deadline = self.loop.call_later(self.read_timeout_s, self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _read_timed_out(self) -> None:
        self._read_deadline = None
        if self.conn.their_state not in _RECEIVED and not self.transport.is_closing():
            self.logger.info("closing a connection whose request did not arrive within %.1f s", self.read_timeout_s)
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:  # the first bytes of a (next) request
            self._arm()
        super().data_received(data)
        if self.conn.their_state in _RECEIVED:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def protocol_class(settings: Settings) -> type[ReadTimeoutH11]:
    """``ReadTimeoutH11`` with the configured deadline (uvicorn instantiates the class itself)."""
    return type("SkrullH11", (ReadTimeoutH11,), {"read_timeout_s": settings.request_read_timeout_s})


def raise_open_files_limit(settings: Settings) -> int:
    """Raise this process's soft limit of open files to fit ``limit_concurrency`` connections plus the
    store's, the solver pipes' and the log's (where the hard limit allows; it is never lowered): at the
    usual soft limit of 1,024 a few hundred idle connections would end ``accept`` before the concurrency
    limit is reached. Returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = settings.limit_concurrency + OTHER_FILES
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if new > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
    return soft


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """The connection limits and timeouts ``uvicorn.run`` is given (documented in docs/service-hardening.md)."""
    return {
        "http": protocol_class(settings),
        "limit_concurrency": settings.limit_concurrency,
        "timeout_keep_alive": settings.timeout_keep_alive_s,
        "h11_max_incomplete_event_size": settings.max_header_bytes,
        "timeout_graceful_shutdown": 10,
    }

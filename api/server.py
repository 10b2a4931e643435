"""Running the app under uvicorn with connection limits and read timeouts (``skrull serve``).

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) and refuses connections beyond
``limit_concurrency`` with 503, but it sets no deadline on reading a request: a client that sends half
its headers, or a body one byte a minute, holds its connection (and a file descriptor, and a
``limit_concurrency`` slot) for as long as it likes. ``ReadDeadline`` adds that deadline: from the moment
a connection opens, and again from the first byte of every following request on it, the whole request
(line, headers and body) must arrive within ``request_read_timeout_s``, else the connection is closed (a
handler waiting for the body sees a disconnect). Writing the answer is not limited here: long-polls
answer when they answer.

It is built from public pieces only. uvicorn accepts any ``asyncio.Protocol`` class as ``http``;
``ReadDeadline`` is one that holds uvicorn's own h11 protocol and hands it every event unchanged
(composition: nothing of uvicorn's is subclassed or reached into). What the wrapper cannot see, where a
request ends, the ASGI layer can: ``ReadDeadlineMiddleware`` tells the connection when the request has
arrived whole (its headers, for a request without a body; its last body chunk otherwise) and when the
answer is sent. The connection is found through a context variable set while uvicorn handles the bytes
(the request's task starts in that context), else by the peer address.

``h11_max_incomplete_event_size`` bounds the request line plus headers (``max_header_bytes``); bodies
are bounded by ``BodySizeLimit``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import resource
import signal
import threading
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from skrull.api.settings import Settings

#: Files the server holds besides its connections (store, solver processes' pipes, logs, the listener).
OTHER_FILES = 512
#: After SIGTERM, how long uvicorn waits for running requests before cancelling them (long-polls and compares
#: end at the signal, so only short store calls are left).
GRACEFUL_SHUTDOWN_S = 2
logger = logging.getLogger("skrull.server")

_CURRENT: contextvars.ContextVar[ReadDeadline | None] = contextvars.ContextVar("skrull_connection", default=None)
#: Live connections by peer address, for a request whose task did not inherit the context.
_BY_PEER: dict[Any, ReadDeadline] = {}


class ReadDeadline(asyncio.Protocol):
    """uvicorn's HTTP protocol, held and fed unchanged, plus a deadline on reading each request."""

    read_timeout_s: float = 15.0
    inner_class: type[asyncio.Protocol] = H11Protocol

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.inner = self.inner_class(*args, **kwargs)
        self.transport: asyncio.Transport | None = None
        self.peer: Any = None
        self._deadline: asyncio.TimerHandle | None = None
        #: "receiving" (a request is arriving), "handling" (it arrived; the answer is being made) or "idle"
        self.state = "receiving"
        self._bytes_while_handling = False

    # -- the deadline ------------------------------------------------------------------------------------

    def _arm(self) -> None:
        self.state = "receiving"
        if self._deadline is None:
            self._deadline = asyncio.get_running_loop().call_later(self.read_timeout_s, self._timed_out)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self) -> None:
        self._deadline = None
        if self.state == "receiving" and self.transport is not None and not self.transport.is_closing():
            logger.info("closing a connection whose request did not arrive within %.1f s", self.read_timeout_s)
            self.transport.close()

    def request_received(self) -> None:
        """The request has arrived whole (ReadDeadlineMiddleware)."""
        self.state = "handling"
        self._bytes_while_handling = False
        self._disarm()

    def response_sent(self) -> None:
        """The answer is out: the next request's clock starts at its first byte (or now, if some came)."""
        self.state = "idle"
        if self._bytes_while_handling:
            self._arm()

    # -- asyncio.Protocol, handed on ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # asyncio's or uvloop's stream transport
        self.peer = transport.get_extra_info("peername")
        if self.peer is not None:
            _BY_PEER[_peer_key(self.peer)] = self
        self._arm()
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.state == "idle":
            self._arm()
        elif self.state == "handling":
            self._bytes_while_handling = True
        token = _CURRENT.set(self)
        try:
            self.inner.data_received(data)
        finally:
            _CURRENT.reset(token)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.peer is not None and _BY_PEER.get(_peer_key(self.peer)) is self:
            del _BY_PEER[_peer_key(self.peer)]
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


def _peer_key(peer: Any) -> Any:
    return tuple(peer[:2]) if isinstance(peer, tuple) else peer


def _connection(scope: Scope) -> ReadDeadline | None:
    found = _CURRENT.get()
    if found is not None:
        return found
    client = scope.get("client")
    return _BY_PEER.get(_peer_key(tuple(client))) if client else None


class ReadDeadlineMiddleware:
    """Tells the request's connection (``ReadDeadline``) when the request has arrived and when its answer
    is sent. Outermost, so it sees the request as uvicorn hands it over; a no-op under other servers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        connection = _connection(scope) if scope["type"] == "http" else None
        if connection is None:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        if b"content-length" not in headers and b"transfer-encoding" not in headers:
            connection.request_received()  # no body: the headers were the whole request
        elif headers.get(b"content-length") == b"0":
            connection.request_received()

        async def receive_tracked() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                connection.request_received()
            return message

        async def send_tracked(message: Message) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                connection.response_sent()

        await self.app(scope, receive_tracked, send_tracked)


def on_stop_signal(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> Callable[[], None]:
    """Run ``callback`` on ``loop`` as soon as SIGTERM or SIGINT arrives, before the handler already installed
    (uvicorn's, which then stops accepting and waits up to ``timeout_graceful_shutdown`` for running
    requests): what would hold those requests (compares) is stopped at the signal, not after the wait.
    Returns a function that puts the previous handlers back. A no-op off the main thread (a test client)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous: dict[int, Any] = {}

    def handler(sig: int, frame: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed already
            loop.call_soon_threadsafe(callback)
        before = previous.get(sig)
        if callable(before):
            before(sig, frame)
        elif before == signal.SIG_DFL:  # nobody else handles it: the default action, as without this hook
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)

    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.getsignal(sig)
        signal.signal(sig, handler)

    def restore() -> None:
        if threading.current_thread() is threading.main_thread():
            for sig, before in previous.items():
                if signal.getsignal(sig) is handler:
                    signal.signal(sig, before)

    return restore


def protocol_class(settings: Settings) -> type[ReadDeadline]:
    """``ReadDeadline`` with the configured deadline (uvicorn instantiates the class itself)."""
    return type("SkrullReadDeadline", (ReadDeadline,), {"read_timeout_s": settings.request_read_timeout_s})


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
        # long-polls answer at SIGTERM and compares are stopped (Service.server_stopping): what is left are short
        # store calls, so a short wait; then the solver processes' grace (app.SHUTDOWN_GRACE_S): exit within 5 s
        "timeout_graceful_shutdown": GRACEFUL_SHUTDOWN_S,
        # uvicorn believes X-Forwarded-For from 127.0.0.1 unless told otherwise: only the named proxies
        "proxy_headers": bool(settings.forwarded_allow_ips.strip()),
        "forwarded_allow_ips": settings.forwarded_allow_ips.strip() or "",
    }

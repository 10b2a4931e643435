"""HTTP promises that hold for every route at once, as ASGI middleware.

* ``HeadAsGet``: HEAD is answered wherever GET is (RFC 9110 9.3.2), with the headers GET would send and
  no body. FastAPI registers GET routes for GET alone, so a HEAD used to answer 405. The request runs as
  a GET (HEAD is a read method for access control, as GET is) and the body is dropped on the way out.
* ``PrivateAnswers``: when the service has tokens, every answer is one client's (its token decides what it
  may see, down to its tenant), so none may be kept by a shared cache: ``Cache-Control: private,
  no-store`` replaces whatever a route set (a rank view's ``public``/``immutable`` caching only holds on
  an open service). ETags still work: a client that kept a view itself revalidates with
  ``If-None-Match`` and gets 304.
* ``BoundedWrites``: an answer is handed to the server in chunks of ``WRITE_CHUNK_BYTES`` (views of the
  shared cache are sliced, not copied), and uvicorn waits for its write buffer to drain below its high-water
  mark before taking the next one, so a client that reads slowly, or never, holds at most about one chunk
  plus that buffer of the server's memory, not its whole answer (a thousand readers that stopped reading a
  1 MB view each used to hold a GB). A client whose answer does not drain within ``write_timeout_s`` is
  cut off, freeing the rest.
"""


from __future__ import annotations

import asyncio
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("skrull.api")
PRIVATE = b"private, no-store"
#: Bytes of an answer handed to the server at a time.
WRITE_CHUNK_BYTES = 64 * 1024


class ClientStoppedReadingError(Exception):
    """An answer did not drain to its client within the write deadline."""


class HeadAsGet:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def send_headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                if not message.get("more_body", False):
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, send_headers_only)


class PrivateAnswers:
    def __init__(self, app: ASGIApp, *, enabled: bool) -> None:
        self.app = app
        self.enabled = enabled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.enabled:
            await self.app(scope, receive, send)
            return

        async def send_private(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"cache-control"]
                message = {**message, "headers": [*headers, (b"cache-control", PRIVATE)]}
            await send(message)

        await self.app(scope, receive, send_private)


class BoundedWrites:
    def __init__(self, app: ASGIApp, *, write_timeout_s: float) -> None:
        self.app = app
        self.write_timeout_s = write_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_bounded(message: Message) -> None:
            body = message.get("body", b"") if message["type"] == "http.response.body" else b""
            if len(body) <= WRITE_CHUNK_BYTES:
                await self._send(send, message)
                return
            view = memoryview(body)
            more = message.get("more_body", False)
            for start in range(0, len(body), WRITE_CHUNK_BYTES):
                piece = view[start : start + WRITE_CHUNK_BYTES]
                last = start + WRITE_CHUNK_BYTES >= len(body)
                await self._send(send, {"type": "http.response.body", "body": piece, "more_body": more or not last})

        try:
            await self.app(scope, receive, send_bounded)
        except ClientStoppedReadingError as exc:  # the answer is incomplete: the server closes the connection
            log.info("%s %s: %s", scope.get("method"), scope.get("path"), exc)

    async def _send(self, send: Send, message: Message) -> None:
        try:
            await asyncio.wait_for(send(message), timeout=self.write_timeout_s)
        except TimeoutError:
            raise ClientStoppedReadingError(
                f"an answer did not drain to its client within {self.write_timeout_s:g} s (SKRULL_WRITE_TIMEOUT_S)"
            ) from None

"""HTTP promises that hold for every route at once, as ASGI middleware.

* ``HeadAsGet``: HEAD is answered wherever GET is (RFC 9110 9.3.2), with the headers GET would send and
  no body. FastAPI registers GET routes for GET alone, so a HEAD used to answer 405. The request runs as
  a GET (HEAD is a read method for access control, as GET is) and the body is dropped on the way out.
* ``PrivateAnswers``: when the service has tokens, every answer is one client's (its token decides what it
  may see, down to its tenant), so none may be kept by a shared cache: ``Cache-Control: private,
  no-store`` replaces whatever a route set (a rank view's ``public``/``immutable`` caching only holds on
  an open service). ETags still work: a client that kept a view itself revalidates with
  ``If-None-Match`` and gets 304.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

PRIVATE = b"private, no-store"


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

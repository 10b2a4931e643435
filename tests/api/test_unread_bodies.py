"""A request that brings a body where no route takes one (``/healthz``, ``/metrics``, unknown paths and
methods, ``//v1/plans``) is answered without its body being read: the answer comes while the body has not
even been sent, and the connection is closed after it. Made-up methods all count under one ``method``
label of the request metrics, so no client can grow the exposition."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import LiveServer

TOKEN = "tokA"
DECLARED_BYTES = 7 * 2**20


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    folder: Path = tmp_path_factory.mktemp("bodies")
    env = {"SKRULL_SUBMIT_TOKENS": f"team-a={TOKEN}", "SKRULL_METRICS_OPEN": "1"}
    live = LiveServer(folder / "jobs.db", solver_processes=0, env=env).start()
    try:
        yield live
    finally:
        live.close()


def _status_before_the_body(server: LiveServer, method: str, path: str, *, token: str | None = None) -> tuple[int, str]:
    """Send the request line and headers declaring a 7 MiB JSON body, none of it; the status line and the
    headers of the answer that comes back (the body is never sent: a server that waited for it would close
    the connection at its read deadline without an answer)."""
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}"
        f"Content-Length: {DECLARED_BYTES}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(head + b'{"batches": [[1')  # the first bytes of the body, the rest never comes
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            assert chunk, f"{method} {path}: the connection closed without an answer (the body was waited for)"
            answer += chunk
    head_text = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    return int(head_text.split()[1]), head_text.lower()


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("POST", "/healthz", 405),
        ("POST", "/metrics", 405),
        ("POST", "/nowhere", 404),
        ("POST", "//v1/plans", 404),
        ("PUT", "/v1/plans", 405),
        ("BREW", "/v1/plans", 405),
        ("GET", "/healthz", 200),
    ],
)
def test_a_body_no_route_takes_is_answered_unread_and_the_connection_closed(
    server: LiveServer, method: str, path: str, status: int
) -> None:
    got, head = _status_before_the_body(server, method, path)
    assert got == status, head
    assert "connection: close" in head


def test_a_body_for_a_route_that_takes_one_still_needs_a_token_first(server: LiveServer) -> None:
    got, head = _status_before_the_body(server, "POST", "/v1/plans")
    assert got == 401 and "connection: close" in head


def test_made_up_methods_share_one_metrics_label(server: LiveServer) -> None:
    for k in range(40):
        httpx.request(f"X{k:03d}", f"{server.url}/v1/plans", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    methods = {
        part.split('"')[1]
        for line in text.splitlines()
        if line.startswith("skrull_http_request_duration_seconds_count")
        for part in line.split(",")
        if part.startswith("method=")
    }
    assert "other" in methods
    assert methods <= {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other"}, methods

"""The planner process's wire format: one JSON document a message, after its 4-byte big-endian length.

A Unix-domain stream socket (``AF_UNIX``, node-local) carries one request and one answer per message between
the node's planner process (server.py) and each rank's client (client.py); both sides read with these
functions, so the format is written once. Messages over ``MAX_MESSAGE_BYTES`` are refused: a whole plan of a
large request is a few MB, so a larger length is a corrupt stream, not a plan.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Mapping
from typing import Any

_HEADER = struct.Struct(">I")
#: Largest message either side accepts (a whole plan of a large request is a few MB).
MAX_MESSAGE_BYTES = 256 * 2**20



def send_message(sock: socket.socket, doc: Mapping[str, Any]) -> None:
    body = json.dumps(doc, separators=(",", ":")).encode()
    sock.sendall(_HEADER.pack(len(body)) + body)


def _receive_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("planner process closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def receive_message(sock: socket.socket) -> dict[str, Any]:
    (size,) = _HEADER.unpack(_receive_exact(sock, _HEADER.size))
    if size > MAX_MESSAGE_BYTES:
        raise ConnectionError(f"message of {size} bytes exceeds {MAX_MESSAGE_BYTES}")
    doc: dict[str, Any] = json.loads(_receive_exact(sock, size))
    return doc

"""Throughput and latency of the planning service, end to end over HTTP.

Starts `skrull serve` (uvicorn, SQLite WAL file, solver processes) on 127.0.0.1 and drives it from one
client process with N concurrent clients (asyncio + httpx, one connection each):

* submit-and-wait: each client POSTs a distinct 256-sequence skrull request (DP4 x CP8, 64 per DP
  rank, llama3-sft-mix lengths) and long-polls GET /v1/plans/{id}?wait=S&until=final (what
  ``PlanningClient.wait`` does) until it is solved; latency is
  from the POST to the solved envelope; plans/s is completed plans over the wall time.
* rank views: clients fetch GET /v1/plans/{id}/ranks/{r}?iteration=0 of solved plans: "first fetch"
  renders the view (store read, worker_view.rank_view), "cached" serves it again from memory, "304"
  sends If-None-Match.

Each is measured twice: with httpx (what ``skrull.api.client`` uses) and with a minimal keep-alive HTTP/1.1
client written here. httpx spends about as much CPU per request as the server (~0.8 ms per rank view,
~2.4 ms per submit-and-wait); on a shared 2-core machine the httpx rows partly measure the client, the
minimal-client rows measure the service.

Prints tables and asserts nothing. The client shares the machine with the server: on a 2-core machine
both compete for the same cores, so these are lower bounds of what a server on its own cores does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from skrull.solver.io import parse_profile, request_to_dict  # noqa: E402
from skrull.solver.lengths.datasets import synthesize_request  # noqa: E402
from skrull.solver.types import Parallel  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_server(db: Path, *, solver_processes: int, synchronous: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "SKRULL_SQLITE_SYNCHRONOUS": synchronous, "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        "-m",
        "skrull.cli.main",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--db",
        str(db),
        "--solver-processes",
        str(solver_processes),
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.05)
    raise RuntimeError("server did not start")


def requests_256(count: int, *, seed0: int) -> list[dict[str, Any]]:
    profile = parse_profile("h100-80g/qwen2.5-0.5b")
    out = []
    for k in range(count):
        request = synthesize_request(
            dataset="llama3-sft-mix",
            parallel=Parallel(dp=4, cp=8),
            profile=profile,
            sequences_per_rank=64,
            num_batches=1,
            seed=seed0 + k,
            bucket_tokens=None,
        )
        out.append(request_to_dict(request))
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def submit_and_wait(url: str, docs: list[dict[str, Any]], clients: int) -> tuple[float, list[float], list[str]]:
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for doc in docs:
        queue.put_nowait(doc)
    latencies: list[float] = []
    ids: list[str] = []

    async def client() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            while not queue.empty():
                doc = queue.get_nowait()
                start = time.perf_counter()
                r = await http.post("/v1/plans", json=doc)
                envelope = r.json()
                while envelope["status"] not in ("solved", "failed"):
                    envelope = (
                        await http.get(f"/v1/plans/{envelope['id']}", params={"wait": 30, "until": "final"})
                    ).json()
                assert envelope["status"] == "solved", envelope
                latencies.append(time.perf_counter() - start)
                ids.append(envelope["id"])

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return time.perf_counter() - start, latencies, ids


async def fetch_views(
    url: str, targets: list[tuple[str, int]], clients: int, *, etags: dict[Any, str] | None
) -> tuple[float, list[float], dict[tuple[str, int], str], dict[int, int]]:
    queue: asyncio.Queue[tuple[str, int]] = asyncio.Queue()
    for t in targets:
        queue.put_nowait(t)
    latencies: list[float] = []
    seen: dict[tuple[str, int], str] = {}
    codes: dict[int, int] = {}

    async def client() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            while not queue.empty():
                plan_id, rank = queue.get_nowait()
                headers = {"If-None-Match": etags[(plan_id, rank)]} if etags else None
                start = time.perf_counter()
                r = await http.get(f"/v1/plans/{plan_id}/ranks/{rank}", params={"iteration": 0}, headers=headers)
                latencies.append(time.perf_counter() - start)
                codes[r.status_code] = codes.get(r.status_code, 0) + 1
                seen[(plan_id, rank)] = r.headers.get("etag", "")

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return time.perf_counter() - start, latencies, seen, codes


async def raw_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, method: str, path: str, body: bytes = b""
) -> tuple[int, bytes]:
    """One request on a kept-alive HTTP/1.1 connection (the minimal client: see the module docstring)."""
    head = f"{method} {path} HTTP/1.1\r\nHost: bench\r\n"
    if body:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    writer.write(head.encode() + b"\r\n" + body)
    answer = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in answer.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return int(answer[9:12]), await reader.readexactly(length)


async def submit_and_wait_raw(
    url: str, docs: list[dict[str, Any]], clients: int
) -> tuple[float, list[float], list[str]]:
    host, port = url.removeprefix("http://").split(":")
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for doc in docs:
        queue.put_nowait(json.dumps(doc).encode())
    latencies: list[float] = []
    ids: list[str] = []

    async def client() -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while not queue.empty():
                body = queue.get_nowait()
                start = time.perf_counter()
                status, answer = await raw_request(reader, writer, "POST", "/v1/plans", body)
                assert status == 202, answer[:200]
                envelope = json.loads(answer)
                while envelope["status"] not in ("solved", "failed"):
                    path = f"/v1/plans/{envelope['id']}?wait=30&until=final"
                    _, answer = await raw_request(reader, writer, "GET", path)
                    envelope = json.loads(answer)
                assert envelope["status"] == "solved", envelope
                latencies.append(time.perf_counter() - start)
                ids.append(envelope["id"])
        finally:
            writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return time.perf_counter() - start, latencies, ids


async def fetch_views_raw(
    url: str, targets: list[tuple[str, int]], clients: int
) -> tuple[float, list[float], dict[int, int]]:
    host, port = url.removeprefix("http://").split(":")
    queue: asyncio.Queue[tuple[str, int]] = asyncio.Queue()
    for t in targets:
        queue.put_nowait(t)
    latencies: list[float] = []
    codes: dict[int, int] = {}

    async def client() -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while not queue.empty():
                plan_id, rank = queue.get_nowait()
                start = time.perf_counter()
                status, body = await raw_request(reader, writer, "GET", f"/v1/plans/{plan_id}/ranks/{rank}?iteration=0")
                assert status != 200 or body.startswith(b'{"plan_id"'), body[:80]
                latencies.append(time.perf_counter() - start)
                codes[status] = codes.get(status, 0) + 1
        finally:
            writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return time.perf_counter() - start, latencies, codes


def row(cells: list[str], widths: list[int]) -> str:
    return (
        "| "
        + " | ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(cells, widths, strict=True)))
        + " |"
    )


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[k]) for r in rows)) for k, h in enumerate(header)]
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([row(header, widths), sep, *(row(r, widths) for r in rows)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plans", type=int, default=600, help="plans to submit per configuration")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--solver-processes", default="1,2", help="comma-separated counts to measure")
    parser.add_argument("--synchronous", default="NORMAL", choices=["NORMAL", "FULL"])
    args = parser.parse_args()

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"server, solver processes and clients share these cores"
    )
    print(
        f"{args.plans} distinct 256-sequence skrull requests (DP4 x CP8, llama3-sft-mix), {args.clients} "
        f"concurrent clients, SQLite synchronous={args.synchronous}\n"
    )
    docs_all = requests_256((args.plans * 2 + 40) * len(args.solver_processes.split(",")), seed0=1000)
    plan_rows = []
    view_rows = []
    offset = 0
    for n in [int(x) for x in args.solver_processes.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            proc, url = start_server(Path(tmp) / "bench.db", solver_processes=n, synchronous=args.synchronous)
            try:
                warm = docs_all[offset : offset + 40]
                asyncio.run(submit_and_wait(url, warm, args.clients))
                docs = docs_all[offset + 40 : offset + 40 + args.plans]
                raw_docs = docs_all[offset + 40 + args.plans : offset + 40 + 2 * args.plans]
                offset += 40 + 2 * args.plans
                wall, lat, _ = asyncio.run(submit_and_wait_raw(url, raw_docs, args.clients))
                plan_rows.append(
                    [
                        str(n),
                        "minimal",
                        str(len(lat)),
                        f"{len(lat) / wall:.1f}",
                        f"{pct(lat, 50) * 1e3:.1f}",
                        f"{pct(lat, 99) * 1e3:.1f}",
                        f"{statistics.mean(lat) * 1e3:.1f}",
                    ]
                )
                wall, lat, ids = asyncio.run(submit_and_wait(url, docs, args.clients))
                plan_rows.append(
                    [
                        str(n),
                        "httpx",
                        str(len(lat)),
                        f"{len(lat) / wall:.1f}",
                        f"{pct(lat, 50) * 1e3:.1f}",
                        f"{pct(lat, 99) * 1e3:.1f}",
                        f"{statistics.mean(lat) * 1e3:.1f}",
                    ]
                )
                every = [(pid, rank) for pid in ids for rank in range(32)]
                half = min(len(every) // 2, 8000)
                raw_targets, httpx_targets = every[:half], every[half : 2 * half]

                def view_row(
                    client: str, kind: str, wall_v: float, lat_v: list[float], codes: dict[int, int], n: int = n
                ) -> None:
                    view_rows.append(
                        [
                            str(n),
                            client,
                            kind,
                            str(len(lat_v)),
                            f"{len(lat_v) / wall_v:.0f}",
                            f"{pct(lat_v, 50) * 1e3:.2f}",
                            f"{pct(lat_v, 99) * 1e3:.2f}",
                            ",".join(f"{c}x{k}" for k, c in sorted(codes.items())),
                        ]
                    )

                for kind in ("first fetch (render)", "cached"):
                    view_row("minimal", kind, *asyncio.run(fetch_views_raw(url, raw_targets, args.clients)))
                view_etags: dict[Any, str] = {}
                for kind in ("first fetch (render)", "cached", "If-None-Match -> 304"):
                    etags = view_etags if kind.startswith("If-None") else None
                    wall_v, lat_v, view_etags, codes = asyncio.run(
                        fetch_views(url, httpx_targets, args.clients, etags=etags)
                    )
                    view_row("httpx", kind, wall_v, lat_v, codes)
                metrics = httpx.get(f"{url}/metrics").text
                solve = [ln for ln in metrics.splitlines() if ln.startswith("skrull_solve_duration_seconds_sum")]
                count = [ln for ln in metrics.splitlines() if ln.startswith("skrull_solve_duration_seconds_count")]
                if solve and count:
                    mean_ms = float(solve[0].split()[-1]) / float(count[0].split()[-1]) * 1e3
                    for r in plan_rows[-2:]:
                        r.append(f"{mean_ms:.1f}")
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
    print("submit-and-wait (POST, then GET ?wait until solved):\n")
    print(
        table(
            [
                "solver processes",
                "client",
                "plans",
                "plans/s",
                "p50 ms",
                "p99 ms",
                "mean ms",
                "solve ms (mean, in process)",
            ],
            plan_rows,
        )
    )
    print("\nrank views (GET /v1/plans/{id}/ranks/{r}?iteration=0):\n")
    print(
        table(["solver processes", "client", "kind", "fetches", "fetches/s", "p50 ms", "p99 ms", "answers"], view_rows)
    )
    print(json.dumps({"plans": plan_rows, "views": view_rows}))


if __name__ == "__main__":
    main()

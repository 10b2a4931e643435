"""The service under hostile load: server memory under the amplification case, how fast slow connections
are closed, and the queue bound under concurrent submits on two replicas (PostgreSQL).

    PYTHONPATH=$PWD python bench/hardening.py [--cp 65536] [--ranks 30] [--slow 300]

* amplification: a ~500-byte request (dp=1, cp=65536, 10 sequences each filling the whole group) whose
  rank views list 65,536 ranks per microbatch; 30 ranks' views are fetched (all pages) and the server's
  RSS is read from /proc before and after. (With 20 sequences, the issue's case, the plan has 2.6 M JSON
  tokens and is refused by SKRULL_MAX_ITERATION_TOKENS.)
* slow connections: ``--slow`` connections each send half their headers, or nothing, and are timed until
  the server closes them (SKRULL_REQUEST_READ_TIMEOUT_S=2).
* queue bound: two ``skrull serve`` replicas on one PostgreSQL database, SKRULL_MAX_QUEUED_JOBS=10, 200
  concurrent distinct submits split between them; the accepted count and the queue depth are printed.

Prints numbers; asserts nothing (the tests assert the limits).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
PROFILE: dict[str, Any] = {
    "name": "hand",
    "compute": {"flops_per_token": 1e9, "flops_per_token_sq": 1e5, "ms_per_tflop": 2.0, "fixed_ms": 0.5},
    "comm": {"bytes_per_token": 2**20, "ms_per_mib": 0.001, "fixed_ms": 0.2},
    "memory": {"bucket_tokens": 100},
    "microbatch_ms": 3.0,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(db: str, env: dict[str, str], *, solvers: int = 1) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "skrull.cli.main", "serve", "--port", str(port), "--db", db]
    cmd += ["--solver-processes", str(solvers), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError("server did not start")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def amplification(cp: int, ranks: int, sequences: int) -> None:
    from skrull.api.client import PlanningClient

    with tempfile.TemporaryDirectory() as folder:
        proc, url = serve(str(Path(folder) / "jobs.db"), {})
        try:
            request = {"batches": [[100 * cp] * sequences], "parallel": {"dp": 1, "cp": cp}, "profile": PROFILE}
            import json

            print(f"amplification: request {len(json.dumps(request))} bytes, dp=1 cp={cp}")
            before = rss_mib(proc.pid)
            with PlanningClient(url, timeout_s=120) as client:
                plan_id = client.submit(request)
                envelope = client.wait(plan_id, timeout_s=600)
                peak = before
                largest_answer = 0
                for rank in range(ranks):
                    first = httpx.get(f"{url}/v1/plans/{plan_id}/ranks/{rank}?iteration=0", timeout=120)
                    largest_answer = max(largest_answer, len(first.content))
                    pages = first.json().get("pages", 1)
                    for page in range(1, pages):
                        r = httpx.get(f"{url}/v1/plans/{plan_id}/ranks/{rank}?iteration=0&page={page}", timeout=120)
                        largest_answer = max(largest_answer, len(r.content))
                    peak = max(peak, rss_mib(proc.pid))
            after = rss_mib(proc.pid)
            print(
                f"  plan {envelope['status']}, {pages} pages per view, largest answer {largest_answer / 2**20:.2f} MiB"
            )
            print(f"  server RSS {before:.0f} MiB before, {peak:.0f} MiB peak, {after:.0f} MiB after {ranks} ranks")
        finally:
            proc.terminate()
            proc.wait()


def slow_connections(count: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        proc, url = serve(str(Path(folder) / "jobs.db"), {"SKRULL_REQUEST_READ_TIMEOUT_S": "2"}, solvers=0)
        port = int(url.rsplit(":", 1)[1])
        try:
            socks = []
            for k in range(count):
                s = socket.create_connection(("127.0.0.1", port))
                if k % 2:
                    s.sendall(b"POST /v1/plans HTTP/1.1\r\nHost: x\r\nContent-Le")
                socks.append(s)
            start = time.monotonic()

            def closed_after(s: socket.socket) -> float:
                s.settimeout(30)
                try:
                    while s.recv(4096):
                        pass
                except OSError:
                    pass
                return time.monotonic() - start

            with concurrent.futures.ThreadPoolExecutor(64) as pool:
                times = sorted(pool.map(closed_after, socks))
            ok = httpx.get(f"{url}/healthz", timeout=5).status_code
            print(
                f"slow connections: {count} held open; closed after {times[0]:.2f} s (first), "
                f"{times[len(times) // 2]:.2f} s (median), {times[-1]:.2f} s (last) with a 2 s deadline; "
                f"/healthz answered {ok} meanwhile"
            )
        finally:
            proc.terminate()
            proc.wait()


def queue_bound(admin_url: str) -> None:
    import psycopg

    name = f"skrull_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    db = admin_url.rsplit("/", 1)[0] + "/" + name
    env = {"SKRULL_MAX_QUEUED_JOBS": "10"}
    servers = [serve(db, env, solvers=0) for _ in range(2)]
    try:

        def submit(k: int) -> tuple[int, str]:
            url = servers[k % 2][1]
            doc = {"batches": [[1 + k % 90, 1 + k // 90]], "parallel": {"dp": 1, "cp": 1}, "profile": PROFILE}
            r = httpx.post(f"{url}/v1/plans", json=doc, timeout=60)
            return r.status_code, "" if r.status_code == 202 else r.json().get("type", "")

        with concurrent.futures.ThreadPoolExecutor(200) as pool:
            answers = collections.Counter(pool.map(submit, range(200)))
        depth = httpx.get(f"{servers[0][1]}/healthz", timeout=5).json()["jobs"]
        print(f"queue bound 10, two replicas, 200 concurrent submits: answers {dict(answers)}; jobs by status {depth}")
    finally:
        for proc, _ in servers:
            proc.terminate()
            proc.wait()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cp", type=int, default=65536)
    parser.add_argument("--ranks", type=int, default=30)
    parser.add_argument("--sequences", type=int, default=10, help="20 exceeds SKRULL_MAX_ITERATION_TOKENS (refused)")
    parser.add_argument("--slow", type=int, default=300)
    parser.add_argument(
        "--pg", default=os.environ.get("SKRULL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--only", choices=("amplification", "slow", "queue"), default=None)
    args = parser.parse_args()
    if args.only in (None, "amplification"):
        amplification(args.cp, args.ranks, args.sequences)
    if args.only in (None, "slow"):
        slow_connections(args.slow)
    if args.only in (None, "queue"):
        queue_bound(args.pg)


if __name__ == "__main__":
    main()

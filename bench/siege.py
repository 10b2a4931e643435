"""The service under siege (issue figures): an authenticated client's latency while clients without a token
post 7 MB bodies, and how fast tokens can be guessed with made-up ``X-Forwarded-For`` headers.

    PYTHONPATH=$PWD python bench/siege.py [--attackers 2] [--seconds 10]

* big bodies: ``--attackers`` threads each POST a 7 MB request body without a token, over and over, for
  ``--seconds``; meanwhile one client with a valid token submits small plans and reads ``/healthz``; its
  p50 and max latency are printed (and the same without attackers, first).
* guessing: 200 unknown tokens, each with a fresh ``X-Forwarded-For``; prints how many were answered 401
  (a real guess) rather than 429, and the guesses per second that made.

Prints numbers; asserts nothing (tests/api/test_siege.py asserts the behaviour).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
TOKEN = {"Authorization": "Bearer tokA"}
SMALL = {
    "batches": [[100, 50]],
    "parallel": {"dp": 1, "cp": 2},
    "profile": {
        "name": "hand",
        "compute": {"flops_per_token": 1e9, "flops_per_token_sq": 1e5, "ms_per_tflop": 2.0, "fixed_ms": 0.5},
        "comm": {"bytes_per_token": 2**20, "ms_per_mib": 0.001, "fixed_ms": 0.2},
        "memory": {"bucket_tokens": 100},
        "microbatch_ms": 3.0,
    },
    "solver": "skrull",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(db: str, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "skrull.cli.main", "serve", "--port", str(port), "--db", db]
    cmd += ["--solver-processes", "0", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError("server did not start")


def probe(url: str, seconds: float, out: list[float], stop: threading.Event) -> None:
    end = time.monotonic() + seconds
    k = 0
    with httpx.Client(timeout=60) as client:
        while time.monotonic() < end and not stop.is_set():
            k += 1
            t0 = time.perf_counter()
            client.post(f"{url}/v1/plans", json={**SMALL, "seed": k}, headers=TOKEN)
            client.get(f"{url}/healthz")
            out.append((time.perf_counter() - t0) / 2)
            time.sleep(0.05)


def attacker(url: str, body: bytes, stop: threading.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(f"{url}/v1/plans", content=body, headers={"Content-Type": "application/json"}, timeout=60)


def big_bodies(url: str, attackers: int, seconds: float) -> None:
    body = ('{"batches": [[' + ",".join(["123456"] * 1_000_000) + ']], "parallel": {"dp": 1, "cp": 1}}').encode()
    body = body[: 7 * 2**20] if len(body) > 7 * 2**20 else body
    for n in (0, attackers):
        stop = threading.Event()
        threads = [threading.Thread(target=attacker, args=(url, body, stop)) for _ in range(n)]
        for t in threads:
            t.start()
        latencies: list[float] = []
        probe(url, seconds, latencies, stop)
        stop.set()
        for t in threads:
            t.join()
        ms = sorted(x * 1000 for x in latencies)
        print(
            f"{n} attackers posting {len(body) / 2**20:.1f} MB without a token: authenticated request + /healthz "
            f"p50 {statistics.median(ms):.1f} ms, max {ms[-1]:.1f} ms ({len(ms)} probes)"
        )


def guessing(url: str) -> None:
    t0 = time.perf_counter()
    codes = [
        httpx.get(
            f"{url}/v1/profiles",
            headers={"Authorization": f"Bearer g{k}", "X-Forwarded-For": f"10.1.{k // 250}.{k % 250}"},
        ).status_code
        for k in range(200)
    ]
    elapsed = time.perf_counter() - t0
    guesses = codes.count(401)
    print(
        f"200 unknown tokens with made-up X-Forwarded-For: {guesses} looked at (401), {codes.count(429)} refused "
        f"(429); {guesses / elapsed:.1f} guesses/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--attackers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = serve(str(Path(tmp) / "skrull.db"), {"SKRULL_SUBMIT_TOKENS": "team-a=tokA"})
        try:
            big_bodies(url, args.attackers, args.seconds)
            guessing(url)
        finally:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()

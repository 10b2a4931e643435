"""The service under siege (issue figures): an authenticated client's latency while clients without a token
post 7 MB bodies, and how fast tokens can be guessed with made-up ``X-Forwarded-For`` headers.

    PYTHONPATH=$PWD python bench/siege.py [--attackers 2] [--seconds 10]

* big bodies: ``--attackers`` threads each POST a 7 MB request body without a token, over and over, for
  ``--seconds``; meanwhile one client with a valid token submits small plans and reads ``/healthz``; its
  p50 and max latency are printed (and the same without attackers, first).
* guessing: 200 unknown tokens, each with a fresh ``X-Forwarded-For``; prints how many were answered 401
  (a real guess) rather than 429, and the guesses per second that made.
* bodies elsewhere: the same attackers post their 7 MB bodies to ``/healthz`` and ``//v1/plans`` (no route
  takes a body there: it is never read); and 3,000 requests with made-up methods, then the size of
  ``/metrics`` and its ``method`` label values.
* shutdown: SIGTERM while 100 long-polls wait on a plan being solved; seconds until the server exits and
  the statuses the long-polls got.
* crowding (two tenants): team-b's 120 s ``ilp`` job holds the one general solver process, team-a submits a
  small job (seconds until solved); with ``SKRULL_MAX_QUEUED_JOBS=10`` team-a submits 25 jobs, then
  team-b one (its status); team-a's 60 s compare runs while team-b compares (team-b's seconds); team-a
  opens 2,000 long-polls on one plan, then team-b reads its plan (seconds, and team-a's statuses).

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


def serve(db: str, env: dict[str, str], *, solver_processes: int = 0) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "skrull.cli.main", "serve", "--port", str(port), "--db", db]
    cmd += ["--solver-processes", str(solver_processes), "--log-level", "warning"]
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


def attacker(url: str, body: bytes, stop: threading.Event, path: str = "/v1/plans") -> None:
    while not stop.is_set():
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(f"{url}{path}", content=body, headers={"Content-Type": "application/json"}, timeout=60)


def big_bodies(url: str, attackers: int, seconds: float, path: str = "/v1/plans") -> None:
    body = ('{"batches": [[' + ",".join(["123456"] * 1_000_000) + ']], "parallel": {"dp": 1, "cp": 1}}').encode()
    body = body[: 7 * 2**20] if len(body) > 7 * 2**20 else body
    print(f"attackers post to {path}")
    for n in (0, attackers):
        stop = threading.Event()
        threads = [threading.Thread(target=attacker, args=(url, body, stop, path)) for _ in range(n)]
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


def made_up_methods(url: str, count: int = 3000) -> None:
    with httpx.Client(timeout=60) as client:
        for k in range(count):
            client.request(f"M{k:05d}", f"{url}/v1/plans", headers=TOKEN)
        t0 = time.perf_counter()
        text = client.get(f"{url}/metrics", headers=TOKEN).text
        scrape_ms = 1000 * (time.perf_counter() - t0)
    methods = {
        part.split('"')[1] for line in text.splitlines() for part in line.split(",") if part.startswith("method=")
    }
    print(
        f"{count} requests with made-up methods: /metrics {len(text) / 1024:.0f} KiB, scraped in {scrape_ms:.0f} ms, "
        f"method labels {sorted(methods)}"
    )


TENANTS = {"team-a": "tokA", "team-b": "tokB"}
TENANT_TOKENS = ",".join(f"{t}={k}" for t, k in TENANTS.items())


def auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TENANTS[tenant]}"}


def wait_for_status(url: str, tenant: str, plan_id: str, wanted: str, limit_s: float = 300) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit_s:
        got = httpx.get(f"{url}/v1/plans/{plan_id}?wait=5", headers=auth(tenant), timeout=60).json()["status"]
        if got == wanted:
            return time.perf_counter() - t0
        time.sleep(0.02)
    return float("inf")


def long_job(seed: int) -> dict[str, object]:
    lengths = [100 + (37 * k * (seed + 1)) % 97 for k in range(48)]
    return {**SMALL, "batches": [lengths], "parallel": {"dp": 4, "cp": 2}, "solver": "ilp", "time_budget_s": 120}


def waiting_long_polls(url: str, headers: dict[str, str] | None = None) -> int:
    for line in httpx.get(f"{url}/metrics", headers=headers, timeout=60).text.splitlines():
        if line.startswith("skrull_long_polls_waiting "):
            return int(float(line.split()[1]))
    return 0


def shutdown(tmp: str) -> None:
    proc, url = serve(str(Path(tmp) / "stop.db"), {}, solver_processes=1)
    plan_id = httpx.post(f"{url}/v1/plans", json=long_job(1), timeout=60).json()["id"]
    while httpx.get(f"{url}/v1/plans/{plan_id}", timeout=60).json()["status"] != "solving":
        time.sleep(0.05)
    codes: list[object] = []

    def poll(path: str) -> None:
        try:
            codes.append(httpx.get(f"{url}{path}", timeout=120).status_code)
        except httpx.HTTPError as exc:
            codes.append(type(exc).__name__)

    paths = [f"/v1/plans/{plan_id}?wait=60&until=final"] * 50 + [
        f"/v1/plans/{plan_id}/ranks/0?iteration=0&wait=60"
    ] * 50
    threads = [threading.Thread(target=poll, args=(p,)) for p in paths]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and waiting_long_polls(url) < len(paths):
        time.sleep(0.1)
    t0 = time.perf_counter()
    proc.terminate()
    proc.wait(120)
    exit_s = time.perf_counter() - t0
    for t in threads:
        t.join(120)
    counts = {str(c): codes.count(c) for c in sorted(set(codes), key=str)}
    print(f"SIGTERM with 100 long-polls waiting: server exited after {exit_s:.2f} s; long-poll answers {counts}")


def crowding(tmp: str) -> None:
    env = {"SKRULL_SUBMIT_TOKENS": TENANT_TOKENS}
    proc, url = serve(str(Path(tmp) / "crowd.db"), env, solver_processes=1)
    try:
        long_id = httpx.post(f"{url}/v1/plans", json=long_job(2), headers=auth("team-b"), timeout=60).json()["id"]
        wait_for_status(url, "team-b", long_id, "solving")
        small = {**SMALL, "time_budget_s": 1.0}
        short_id = httpx.post(f"{url}/v1/plans", json=small, headers=auth("team-a"), timeout=60).json()["id"]
        seconds = wait_for_status(url, "team-a", short_id, "solved")
        print(
            f"team-a's 1 s job while team-b's 120 s ilp job solves (1 + 1 short solver process): "
            f"solved in {seconds:.2f} s"
        )
        slow = {**SMALL, "batches": [[100 + k for k in range(40)]], "parallel": {"dp": 4, "cp": 2}, "time_budget_s": 20}
        holder = threading.Thread(
            target=lambda: httpx.post(
                f"{url}/v1/compare", json={**slow, "solvers": ["ilp"]}, headers=auth("team-a"), timeout=600
            )
        )
        holder.start()
        time.sleep(2)
        t0 = time.perf_counter()
        quick = httpx.post(
            f"{url}/v1/compare", json={**small, "solvers": ["round-robin"]}, headers=auth("team-b"), timeout=600
        )
        print(
            f"team-b's compare while team-a's 20 s ilp compare runs: {quick.status_code} in "
            f"{time.perf_counter() - t0:.2f} s"
        )
        holder.join()
        a_plan = httpx.post(f"{url}/v1/plans", json=long_job(3), headers=auth("team-a"), timeout=60).json()["id"]
        b_plan = httpx.post(f"{url}/v1/plans", json={**small, "seed": 9}, headers=auth("team-b"), timeout=60).json()[
            "id"
        ]
        codes: list[object] = []

        def poll() -> None:
            try:
                codes.append(
                    httpx.get(f"{url}/v1/plans/{a_plan}?wait=60", headers=auth("team-a"), timeout=180).status_code
                )
            except httpx.HTTPError as exc:
                codes.append(type(exc).__name__)

        threads = [threading.Thread(target=poll) for _ in range(2000)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and waiting_long_polls(url, auth("team-a")) < 1000:
            time.sleep(0.1)
        t0 = time.perf_counter()
        first = httpx.get(f"{url}/v1/plans/{b_plan}", headers=auth("team-b"), timeout=120)
        b_ms = 1000 * (time.perf_counter() - t0)
        for t in threads:
            t.join()
        counts = {str(c): codes.count(c) for c in sorted(set(codes), key=str)}
        print(
            f"team-a's 2,000 long-polls on one plan: team-b's first GET {first.status_code} in {b_ms:.0f} ms; "
            f"team-a got {counts}"
        )
    finally:
        proc.terminate()
        proc.wait(60)
    proc, url = serve(str(Path(tmp) / "queue.db"), {**env, "SKRULL_MAX_QUEUED_JOBS": "10"})
    try:
        codes2 = [
            httpx.post(f"{url}/v1/plans", json={**SMALL, "seed": k}, headers=auth("team-a"), timeout=60).status_code
            for k in range(25)
        ]
        b = httpx.post(f"{url}/v1/plans", json={**SMALL, "seed": 99}, headers=auth("team-b"), timeout=60)
        print(
            f"SKRULL_MAX_QUEUED_JOBS=10: team-a's 25 submissions got {codes2.count(202)} x 202, "
            f"{codes2.count(429)} x 429; team-b's first got {b.status_code}"
        )
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--attackers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--only", choices=["bodies", "shutdown", "crowding"], default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "bodies"):
            proc, url = serve(str(Path(tmp) / "skrull.db"), {"SKRULL_SUBMIT_TOKENS": "team-a=tokA"})
            try:
                big_bodies(url, args.attackers, args.seconds)
                for path in ("/healthz", "//v1/plans"):
                    big_bodies(url, args.attackers, args.seconds, path=path)
                guessing(url)
                made_up_methods(url)
            finally:
                proc.terminate()
                proc.wait(30)
        if args.only in (None, "shutdown"):
            shutdown(tmp)
        if args.only in (None, "crowding"):
            crowding(tmp)


if __name__ == "__main__":
    main()

"""Long-poll deadlines under load: N concurrent ``GET /v1/plans/{id}?wait=1`` (raw connections, so the
figure is the server's) against a real ``skrull serve`` whose plans never change (no solver processes).
Target: every answer within wait + 0.5 s at 1,000 concurrent. Prints a table; asserts nothing.
Run: python bench/long_poll.py [--waiters 100,1000] [--plans 3]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's tests package: its server helpers
from tests.api.conftest import LiveServer, plan_request
from tests.api.test_long_poll_load import WAIT_S, _long_polls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--waiters", default="100,1000")
    parser.add_argument("--plans", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {platform.machine()} python {platform.python_version()}, wait={WAIT_S} s\n")
    print("| concurrent long-polls | plans | median s | p99 s | max s | worst overrun s |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as root:
        server = LiveServer(Path(root) / "s.db", solver_processes=0).start()
        try:
            ids = [
                httpx.post(f"{server.url}/v1/plans", json=plan_request([[10 + k, 20]], dp=1, cp=2)).json()["id"]
                for k in range(args.plans)
            ]
            for waiters in (int(w) for w in args.waiters.split(",")):
                elapsed = sorted(asyncio.run(_long_polls(server.url, ids, waiters)))
                p99 = elapsed[min(len(elapsed) - 1, int(0.99 * len(elapsed)))]
                print(
                    f"| {waiters} | {args.plans} | {statistics.median(elapsed):.2f} | {p99:.2f} "
                    f"| {elapsed[-1]:.2f} | {elapsed[-1] - WAIT_S:.2f} |"
                )
        finally:
            server.close()


if __name__ == "__main__":
    main()

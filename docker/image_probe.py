"""Try a running image: ``python3 docker/image_probe.py URL`` (the standard library only, so the host
needs no project environment). Waits for ``/healthz``, submits the bundled contract-example.json,
long-polls its plan until solved and reads GPU 0's rank view of iteration 0; exit status 0 when every step answered
as docs/service.md says, else 1 with one line naming the step.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REQUEST = Path(__file__).resolve().parent.parent / "examples" / "requests" / "contract-example.json"
START_TIMEOUT_S = 120.0
SOLVE_TIMEOUT_S = 60.0


def call(url: str, *, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=SOLVE_TIMEOUT_S + 5) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def probe(base: str) -> str | None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            if call(f"{base}/healthz")[0] == 200:
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            return f"/healthz: no 200 within {START_TIMEOUT_S:.0f} s"
        time.sleep(0.5)
    request = json.loads(REQUEST.read_text())
    status, envelope = call(f"{base}/v1/plans", body=request)
    if status != 202:
        return f"POST /v1/plans: {status} {envelope}"
    plan_id = envelope["id"]
    status, envelope = call(f"{base}/v1/plans/{plan_id}?wait={SOLVE_TIMEOUT_S:g}&until=final")
    if status != 200 or envelope["status"] != "solved":
        return f"GET /v1/plans/{plan_id}: {status} {envelope.get('status')} {envelope.get('error')}"
    status, view = call(f"{base}/v1/plans/{plan_id}/ranks/0?iteration=0")
    if status != 200 or view.get("rank") != 0 or view.get("iteration") != 0 or not view.get("microbatches"):
        return f"GET /v1/plans/{plan_id}/ranks/0?iteration=0: {status} {view}"
    count, tokens = len(view["microbatches"]), view["num_tokens_in_iteration"]
    print(f"image-check: plan {plan_id} solved; rank 0 runs {count} microbatch(es) of iteration 0 ({tokens} tokens)")
    return None


if __name__ == "__main__":
    failure = probe(sys.argv[1].rstrip("/"))
    if failure is not None:
        print(f"image-check: {failure}", file=sys.stderr)
    sys.exit(0 if failure is None else 1)

"""The service as users run it: `skrull serve` (uvicorn) in a subprocess on 127.0.0.1, a real SQLite file,
real solver processes, real HTTP."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import time
from typing import Any

import httpx

from skrull.api.client import PlanningClient
from skrull.solver.io import parse_profile, plan_from_dict, request_from_dict, request_to_dict
from skrull.solver.lengths.datasets import synthesize_request
from skrull.solver.types import Parallel
from skrull.solver.validate import plan_problems
from tests.api.conftest import ROOT, LiveServer, plan_request, running
from tests.api.coverage import assert_views_cover_every_token_once

PROBLEM = "application/problem+json"
#: uvicorn re-raises SIGTERM after its graceful shutdown
GRACEFUL = (0, -signal.SIGTERM)


def dataset_request(*, seed: int, batches: int = 2, dp: int = 4, cp: int = 8, per_rank: int = 32) -> dict[str, Any]:
    request = synthesize_request(
        dataset="llama3-sft-mix",
        parallel=Parallel(dp=dp, cp=cp),
        profile=parse_profile("h100-80g/qwen2.5-0.5b"),
        sequences_per_rank=per_rank,
        num_batches=batches,
        seed=seed,
        bucket_tokens=None,
    )
    doc = request_to_dict(request)
    return doc


def test_submit_poll_and_all_rank_views_cover_every_token_once(live_server: LiveServer) -> None:
    doc = dataset_request(seed=11, batches=3)
    with PlanningClient(live_server.url) as client:
        plan_id = client.submit(doc)
        envelope = client.wait(plan_id, timeout_s=30)
        assert plan_problems(plan_from_dict(envelope["plan"]), request_from_dict(doc)) == []
        views = [client.rank_view(plan_id, rank, it) for it in range(3) for rank in range(32)]
    lengths = [n for batch in doc["batches"] for n in batch]
    assert_views_cover_every_token_once(views, lengths)


def test_concurrent_clients_all_get_valid_plans(live_server: LiveServer) -> None:
    docs = [dataset_request(seed=100 + k, batches=1, per_rank=16) for k in range(24)]

    def submit_and_wait(doc: dict[str, Any]) -> dict[str, Any]:
        with PlanningClient(live_server.url) as client:
            return client.submit_and_wait(doc, timeout_s=60)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        envelopes = list(pool.map(submit_and_wait, docs))
    assert len({e["id"] for e in envelopes}) == 24
    for doc, envelope in zip(docs, envelopes, strict=True):
        assert envelope["status"] == "solved"
        assert plan_problems(plan_from_dict(envelope["plan"]), request_from_dict(doc)) == []


def test_a_long_poll_returns_as_soon_as_the_plan_is_solved(live_server: LiveServer) -> None:
    doc = plan_request([[10, 20], [30, 40]], solver="test-slow", seed=5)
    plan_id = httpx.post(f"{live_server.url}/v1/plans", json=doc).json()["id"]
    start = time.monotonic()
    statuses = []
    while not statuses or statuses[-1] != "solved":
        r = httpx.get(f"{live_server.url}/v1/plans/{plan_id}", params={"wait": 60}, timeout=90)
        statuses.append(r.json()["status"])
    elapsed = time.monotonic() - start
    assert elapsed < 30, f"long-poll took {elapsed:.1f} s"  # woken when solved, not after its 60 s wait
    assert statuses[-1] == "solved" and len(statuses) <= 4


def test_rank_views_carry_an_etag_and_answer_304_over_http(live_server: LiveServer) -> None:
    with PlanningClient(live_server.url) as client:
        plan_id = client.submit(plan_request([[100, 99, 7]]))
        client.wait(plan_id)
    url = f"{live_server.url}/v1/plans/{plan_id}/ranks/0"
    first = httpx.get(url, params={"iteration": 0})
    assert first.status_code == 200 and first.headers["etag"]
    again = httpx.get(url, params={"iteration": 0}, headers={"If-None-Match": first.headers["etag"]})
    assert again.status_code == 304


def test_bad_input_over_http_gets_problem_json(live_server: LiveServer) -> None:
    base = live_server.url
    answers = [
        httpx.post(f"{base}/v1/plans", content=b"{not json", headers={"content-type": "application/json"}),
        httpx.post(f"{base}/v1/plans", json={**plan_request([[10]]), "parallel": {"dp": -1, "cp": 1}}),
        httpx.post(f"{base}/v1/plans", content=b"x" * (9 * 2**20), headers={"content-type": "application/json"}),
        httpx.get(f"{base}/v1/plans/nope"),
        httpx.get(f"{base}/v1/plans/nope/ranks/0", params={"iteration": "first"}),
    ]
    assert [r.status_code for r in answers] == [422, 422, 413, 404, 422]
    for r in answers:
        assert r.headers["content-type"] == PROBLEM
        assert {"type", "title", "status", "detail"} <= set(r.json())


def test_a_restart_mid_queue_loses_nothing(store_location: str, live_server_factory: Any) -> None:
    db = store_location
    accepting = live_server_factory(db, solver_processes=0).start()
    docs = [plan_request([[k, 2 * k, 3 * k], [k + 1]]) for k in range(1, 9)]
    ids = [httpx.post(f"{accepting.url}/v1/plans", json=doc).json()["id"] for doc in docs]
    assert {httpx.get(f"{accepting.url}/v1/plans/{i}").json()["status"] for i in ids} == {"queued"}
    assert accepting.stop() in GRACEFUL

    solving = live_server_factory(db, solver_processes=1).start()
    with PlanningClient(solving.url) as client:
        envelopes = [client.wait(i, timeout_s=30) for i in ids]
    for doc, envelope in zip(docs, envelopes, strict=True):
        assert plan_problems(plan_from_dict(envelope["plan"]), request_from_dict(doc)) == []
    assert solving.stop() in GRACEFUL

    reading = live_server_factory(db, solver_processes=0).start()
    for i, envelope in zip(ids, envelopes, strict=True):
        again = httpx.get(f"{reading.url}/v1/plans/{i}").json()
        assert again["status"] == "solved" and again["plan"] == envelope["plan"]
    assert httpx.get(f"{reading.url}/v1/plans/{ids[0]}/ranks/3", params={"iteration": 1}).status_code == 200


def test_a_server_killed_while_solving_loses_nothing(store_location: str, live_server_factory: Any) -> None:
    db = store_location
    # 3 jobs of 4 iterations at 0.5 s each: 6 s of solving, of which the kill leaves at least 5.5 s undone.
    # A 3 s lease, renewed every second: a heartbeat a loaded machine delays by a second or so must not
    # lose a live solve its lease (an extra attempt), while the dead server's lease still runs out soon.
    env = {"SKRULL_LEASE_S": "3", "SKRULL_TEST_SLEEP_S": "0.5"}
    first = live_server_factory(db, solver_processes=1, env=env).start()
    docs = [plan_request([[k], [k + 1], [k + 2], [k + 3]], solver="test-slow") for k in range(1, 4)]
    ids = [httpx.post(f"{first.url}/v1/plans", json=doc).json()["id"] for doc in docs]
    deadline = time.monotonic() + 20
    while httpx.get(f"{first.url}/v1/plans/{ids[0]}").json()["progress"]["iterations_solved"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    first.kill()

    second = live_server_factory(db, solver_processes=1, env=env).start()
    with PlanningClient(second.url) as client:
        envelopes = [client.wait(i, timeout_s=60) for i in ids]
    # the job being solved when the server died is taken back from its expired lease and resumed. Which job
    # that was depends on how fast the first server got on (a loaded machine may let the first job finish
    # between the poll and the kill): at least one was, and every one taken back says why
    taken_back = [e for e in envelopes if e["attempts"] == 2]
    assert taken_back and all(e["attempts"] in (1, 2) for e in envelopes), [e["attempts"] for e in envelopes]
    assert all(e["last_error"]["type"] == "urn:skrull:problem:lease-expired" for e in taken_back)
    for doc, envelope in zip(docs, envelopes, strict=True):
        request = request_from_dict(json.loads(json.dumps(doc)))
        assert plan_problems(plan_from_dict(envelope["plan"]), request) == []


def test_solver_processes_exit_once_their_server_is_gone(live_server_factory: Any) -> None:
    server = live_server_factory(solver_processes=2).start()
    pids = server.solver_pids()
    assert len(pids) >= 2
    server.kill(children_too=False)
    deadline = time.monotonic() + 15
    while any(running(pid) for pid in pids):
        assert time.monotonic() < deadline, "orphaned solver processes kept running"
        time.sleep(0.1)


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        return b""


def test_a_server_that_ran_a_compare_shuts_down_without_leaking_semaphores(live_server_factory: Any) -> None:
    # the compare process's planners register semaphores with multiprocessing's resource tracker; the
    # server must let that process exit cleanly, or the tracker warns of leaked semaphores at exit
    server = live_server_factory().start()
    doc = json.loads((ROOT / "examples" / "requests" / "contract-example.json").read_text())
    solvers = ["skrull", "ilp", "ilp-flex", "auto", "hydraulis"]  # the ones that start solver processes
    r = httpx.post(f"{server.url}/v1/compare", json={**doc, "solvers": solvers}, timeout=120)
    assert r.status_code == 200, r.text
    # the tracker, a child of the server, writes its warning to the server's log as it exits, after it
    trackers = [pid for pid in server.solver_pids() if b"resource_tracker" in _cmdline(pid)]
    assert trackers, "no resource tracker under the server: nothing to check"
    assert server.stop() in GRACEFUL
    deadline = time.monotonic() + 60
    while any(running(pid) for pid in trackers):
        assert time.monotonic() < deadline, "the resource tracker outlived its server by a minute"
        time.sleep(0.05)
    log = server.log.read_text()
    assert "leaked semaphore" not in log, log

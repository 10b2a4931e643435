"""The service serves exactly the plan it solved: for every planner and every iteration of a held-out
request, every served rank view equals the planning library's view of the stored plan
(``solver.worker_view.plan_rank_view``), and over each microbatch's group the served ranges hold every
token of every sequence exactly once."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from skrull.api import views as views_module
from skrull.solver.io import parse_profile, plan_from_dict, request_to_dict
from skrull.solver.lengths.datasets import synthesize_request
from skrull.solver.types import Parallel, Plan
from skrull.solver.worker_view import plan_rank_view
from tests.api.conftest import LiveServer, plan_request, running_app
from tests.conftest import allgather_planners

#: The project's planners (the service tests' own planners excluded).
PLANNERS = tuple(name for name in allgather_planners() if not name.startswith("test-"))
DP, CP = 2, 4


def held_out_request(solver: str) -> dict[str, Any]:
    """Long-context SFT lengths from a seed no other test uses: sharded and local sequences, WLB's two
    sharding modes and pending ids, dynamic CP's groups wider than CP."""
    request = synthesize_request(
        dataset="chatqa2-long-sft",
        parallel=Parallel(dp=DP, cp=CP),
        profile=parse_profile("h100-80g/qwen2.5-0.5b"),
        sequences_per_rank=10,
        num_batches=3,
        seed=20261123,
        bucket_tokens=None,
    )
    return {**request_to_dict(request), "solver": solver, "time_budget_s": 0.5, "deterministic": True}


def check_views(plan_id: str, plan: Plan, lengths: Sequence[int], get_view: Any) -> None:
    for it in plan.iterations:
        served = {rank: get_view(plan_id, rank, it.index) for rank in range(plan.parallel.num_gpus)}
        for rank, view in served.items():
            assert view == plan_rank_view(plan, lengths, iteration=it.index, rank=rank).to_dict(plan_id=plan_id)
        for mb in it.microbatches:
            held: dict[int, list[tuple[int, int]]] = {i: [] for i in mb.seq_ids}
            for position, rank in enumerate(mb.ranks):
                (part,) = [m for m in served[rank]["microbatches"] if m["step"] == mb.step]
                assert part["ranks"] == list(mb.ranks) and part["position"] == position
                for i in part["local"]:
                    held[i].append((0, lengths[i]))
                for shard in part["shards"]:
                    held[shard["id"]].extend((a, b) for a, b in shard["ranges"])
            for i, ranges in held.items():
                covered = 0
                for start, end in sorted(ranges):
                    assert start == covered, f"iteration {it.index} step {mb.step}: sequence {i} at {start}"
                    covered = end
                assert covered == lengths[i], f"iteration {it.index} step {mb.step}: sequence {i} short"


def solved_plan(envelope: dict[str, Any]) -> Plan:
    assert envelope["status"] == "solved", envelope
    return plan_from_dict(envelope["plan"])


@pytest.mark.parametrize("solver", PLANNERS)
def test_every_served_rank_view_is_the_librarys_view_of_the_stored_plan(shared_app: TestClient, solver: str) -> None:
    doc = held_out_request(solver)
    plan_id = shared_app.post("/v1/plans", json=doc).json()["id"]
    envelope: dict[str, Any] = {}
    for _ in range(120):
        envelope = shared_app.get(f"/v1/plans/{plan_id}", params={"wait": 5}).json()
        if envelope["status"] in ("solved", "failed"):
            break
    plan = solved_plan(envelope)
    lengths = [n for batch in doc["batches"] for n in batch]

    def get_view(plan_id: str, rank: int, iteration: int) -> dict[str, Any]:
        r = shared_app.get(f"/v1/plans/{plan_id}/ranks/{rank}", params={"iteration": iteration})
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body

    check_views(plan_id, plan, lengths, get_view)


@pytest.mark.parametrize("solver", ["wlb", "dynamic-cp", "skrull"])
def test_a_real_server_serves_the_librarys_views(live_server: LiveServer, solver: str) -> None:
    doc = held_out_request(solver)
    with httpx.Client(base_url=live_server.url, timeout=60) as client:
        plan_id = client.post("/v1/plans", json=doc).json()["id"]
        envelope: dict[str, Any] = {}
        for _ in range(60):
            envelope = client.get(f"/v1/plans/{plan_id}", params={"wait": 5}).json()
            if envelope["status"] in ("solved", "failed"):
                break
        plan = solved_plan(envelope)

        def get_view(plan_id: str, rank: int, iteration: int) -> dict[str, Any]:
            r = client.get(f"/v1/plans/{plan_id}/ranks/{rank}", params={"iteration": iteration})
            assert r.status_code == 200, r.text
            body: dict[str, Any] = r.json()
            return body

        check_views(plan_id, plan, [n for batch in doc["batches"] for n in batch], get_view)


@pytest.mark.slow  # a plan on 4096 GPUs, solved and rendered: half a minute
def test_large_iterations_render_in_their_own_slot(tmp_path: Path) -> None:
    # A huge plan's first fetches must not hold the slots every other plan's first fetch needs (and the
    # reverse): with the ordinary slots taken, a large iteration still renders, and with the large slot
    # taken, an ordinary one does.
    with running_app(tmp_path / "s.db") as client:
        small = client.post("/v1/plans", json=plan_request([[10, 20, 150]], dp=1, cp=2)).json()["id"]
        large_doc = plan_request([[150 + k for k in range(40)]], dp=1, cp=4096, solver="deepspeed")
        large = client.post("/v1/plans", json=large_doc).json()["id"]
        for plan_id in (small, large):
            final = client.get(f"/v1/plans/{plan_id}", params={"wait": 30, "until": "final"}).json()
            assert final["status"] == "solved"
        views = client.app.state.service.views  # type: ignore[attr-defined]
        store = client.app.state.service.store  # type: ignore[attr-defined]
        small_record, large_record = store.iteration(small, 0), store.iteration(large, 0)
        assert len(large_record.doc_json) > views_module.LARGE_ITERATION_BYTES > len(small_record.doc_json)
        for taken, record in ((views._cold, large_record), (views._cold_large, small_record)):
            held = [taken.acquire(timeout=1) for _ in range(8)]
            try:
                done = threading.Event()

                def render(r: Any = record, finished: threading.Event = done) -> None:
                    views.render(r, 1)
                    finished.set()

                worker = threading.Thread(target=render)
                worker.start()
                assert done.wait(timeout=20), "a render waited for a slot of the other kind"
            finally:
                for ok in held:
                    if ok:
                        taken.release()
            worker.join()

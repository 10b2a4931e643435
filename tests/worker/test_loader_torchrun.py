"""The planned loader as a training job runs it: ``torchrun --standalone --nproc-per-node 4`` (gloo, env://),
a DeviceMesh with "dp" and "cp" (and "tp") dims, plans computed in each process with no service and no
broadcast, and resuming from ``state_dict``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from examples.train_tiny import TINY_PROFILE, make_dataset
from skrull.corpus.order import global_batches
from skrull.solver.errors import RequestError
from skrull.worker.dataloader import PlannedBatches, resolve_rank
from skrull.worker.loader_options import LoaderOptions
from skrull.worker.plan_sources import LocalPlans
from tests.launch import run_torchrun

HERE = Path(__file__).resolve().parent


#: The meshes the loader runs under, all in one launch of 4 processes (each launch costs its start-up).
SHAPES = {"dp2-cp2": {"dp": 2, "cp": 2}, "dp2-cp1-tp2": {"dp": 2, "cp": 1, "tp": 2}}


@pytest.fixture(scope="module")
def torchrun(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """What each rank got under each of ``SHAPES``, by shape."""
    out = tmp_path_factory.mktemp("loader-torchrun")
    done = run_torchrun(HERE / "torchrun_loader.py", [str(out), json.dumps(SHAPES)], nproc=4, cwd=out, timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return {name: [json.loads((out / f"{name}-rank{r}.json").read_text()) for r in range(4)] for name in SHAPES}


def test_four_torchrun_processes_share_one_plan_and_train_every_token_once(
    torchrun: dict[str, list[dict[str, Any]]],
) -> None:
    results = torchrun["dp2-cp2"]
    assert sorted(r["rank"] for r in results) == [0, 1, 2, 3]
    plans = {(g["iteration"], g["plan"]) for r in results for g in r["got"]}
    assert len({it for it, _ in plans}) == len(plans) == 3  # one plan per iteration, the same on every rank
    dataset = make_dataset(64, max_tokens=128, seed=4)
    seen: dict[tuple[int, int], int] = {}
    for r in results:
        for g in r["got"]:
            for (sample, pos), token in zip(g["rows"], g["ids"], strict=True):
                assert dataset[sample][pos] == token
                seen[(sample, pos)] = seen.get((sample, pos), 0) + 1
    order = global_batches(64, global_batch_size=16, seed=4)[:3]
    assert seen == {(s, p): 1 for b in order for s in b for p in range(len(dataset[s]))}


def test_tensor_parallel_peers_get_the_same_view(torchrun: dict[str, list[dict[str, Any]]]) -> None:
    results = torchrun["dp2-cp1-tp2"]
    by_rank: dict[int, list[Any]] = {r["rank"]: [] for r in results}
    for r in results:
        by_rank[r["rank"]].append(r["got"])
    assert sorted(by_rank) == [0, 1]  # plan ranks: dp_rank * cp + cp_rank; tp peers share theirs
    for views in by_rank.values():
        assert len(views) == 2 and views[0] == views[1]


def _run(loader: PlannedBatches) -> list[tuple[int, tuple[int, ...], list[list[int]]]]:
    out = [(r.iteration, r.sample_indices, [mb.input_ids.tolist() for mb in r.microbatches]) for r in loader]
    loader.close()
    return out


def test_a_resumed_loader_continues_with_the_very_next_iteration_and_its_plan() -> None:
    dataset = make_dataset(96, max_tokens=128, seed=6)
    options = LoaderOptions(global_batch_size=12, profile=TINY_PROFILE, seed=6, rank=3, dp=2, cp=2)
    straight = _run(PlannedBatches(dataset, [len(s) for s in dataset], options))
    first = PlannedBatches(dataset, [len(s) for s in dataset], options)
    head = []
    for ready in first:
        head.append((ready.iteration, ready.sample_indices, [mb.input_ids.tolist() for mb in ready.microbatches]))
        if len(head) == 3:
            break
    state = first.state_dict()
    first.close()
    assert state["next_iteration"] == 3
    resumed = PlannedBatches(dataset, [len(s) for s in dataset], options)  # a new process would build this
    resumed.load_state_dict(state)
    assert head + _run(resumed) == straight
    other = PlannedBatches(dataset, [len(s) for s in dataset], dataclasses.replace(options, seed=7))
    with pytest.raises(RequestError, match=r"state_dict\.seed"):
        other.load_state_dict(state)


def test_in_process_plans_are_the_services_plans(tmp_path: Path) -> None:
    from skrull.api.client import PlanningClient
    from tests.api.conftest import LiveServer

    dataset = make_dataset(48, max_tokens=128, seed=8)
    loader = PlannedBatches(
        dataset,
        [len(s) for s in dataset],
        LoaderOptions(global_batch_size=16, profile=TINY_PROFILE, seed=8, rank=0, dp=2, cp=2),
    )
    doc = loader.request_document(0)
    loader.close()
    local = LocalPlans()
    server = LiveServer(tmp_path / "skrull.db").start()
    try:
        with PlanningClient(server.url) as client:
            served_id, local_id = client.submit(doc), local.submit(doc)
            for rank in range(4):
                served = client.rank_view(served_id, rank, 0, timeout_s=60)
                mine = local.rank_view(local_id, rank, 0)
                assert {k: v for k, v in mine.items() if k != "plan_id"} == {
                    k: v for k, v in served.items() if k != "plan_id"
                }
    finally:
        server.close()
        local.close()


class FakeMesh:
    def __init__(self, names: tuple[str, ...], sizes: tuple[int, ...], coords: tuple[int, ...]) -> None:
        self.mesh_dim_names, self._sizes, self._coords = names, sizes, coords

    def size(self, dim: int) -> int:
        return self._sizes[dim]

    def get_local_rank(self, name: str) -> int:
        return self._coords[self.mesh_dim_names.index(name)]


def test_the_rank_comes_from_the_mesh_or_torchrun_or_is_named_when_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    mesh: Any = FakeMesh(("dp", "cp", "tp"), (2, 4, 2), (1, 3, 1))
    assert resolve_rank(rank=None, dp=None, cp=None, mesh=mesh) == (7, 2, 4)
    with pytest.raises(RequestError, match='needs dims named "dp" and "cp"'):
        resolve_rank(rank=None, dp=None, cp=None, mesh=FakeMesh(("data", "ctx"), (2, 2), (0, 0)))  # type: ignore[arg-type]
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert not torch.distributed.is_initialized()
    assert resolve_rank(rank=None, dp=None, cp=4, mesh=None) == (5, 2, 4)
    with pytest.raises(RequestError, match="must divide the world size 8"):
        resolve_rank(rank=None, dp=None, cp=3, mesh=None)
    with pytest.raises(RequestError, match=r"is needed under torch.distributed \(world size 8\): LoaderOptions\(cp="):
        resolve_rank(rank=None, dp=None, cp=None, mesh=None)
    monkeypatch.delenv("RANK")
    with pytest.raises(RequestError, match="run under torchrun"):
        resolve_rank(rank=None, dp=None, cp=4, mesh=None)

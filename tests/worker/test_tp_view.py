"""A "tp" dim of the DeviceMesh: the ranks of one tensor-parallel group are one GPU slot of the plan, so
they resolve to the same plan rank and get the same microbatches (single process, a stand-in mesh)."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from skrull.worker.dataloader import PlannedBatches, resolve_rank
from skrull.worker.loader_options import LoaderOptions

#: A CPU-sized profile: every sequence below fits one GPU's bucket or a CP group's.
PROFILE: dict[str, Any] = {
    "name": "tiny-tp",
    "compute": {"flops_per_token": 1e9, "flops_per_token_sq": 1e5, "ms_per_tflop": 2.0, "fixed_ms": 0.5},
    "comm": {"bytes_per_token": 2**20, "ms_per_mib": 0.001, "fixed_ms": 0.2},
    "memory": {"bucket_tokens": 64},
    "microbatch_ms": 3.0,
}


class Mesh:
    """What ``resolve_rank`` reads of a ``torch.distributed.DeviceMesh``: dim names, sizes, this rank's coordinates."""

    def __init__(self, shape: dict[str, int], coords: dict[str, int]) -> None:
        self.mesh_dim_names = tuple(shape)
        self._shape, self._coords = shape, coords

    def size(self, dim: int) -> int:
        return self._shape[self.mesh_dim_names[dim]]

    def get_local_rank(self, name: str) -> int:
        return self._coords[name]


@pytest.mark.parametrize("order", [("dp", "cp", "tp"), ("tp", "dp", "cp"), ("dp", "tp", "cp")])
def test_every_tp_rank_of_a_slot_resolves_to_the_slots_plan_rank(order: tuple[str, ...]) -> None:
    sizes = {"dp": 2, "cp": 3, "tp": 4}
    shape = {name: sizes[name] for name in order}
    for d, c, t in itertools.product(range(2), range(3), range(4)):
        mesh: Any = Mesh(shape, {"dp": d, "cp": c, "tp": t})
        assert resolve_rank(rank=None, dp=None, cp=None, mesh=mesh) == (d * 3 + c, 2, 3)


def _microbatches(tp_rank: int) -> list[tuple[int, tuple[int, ...], list[list[int]]]]:
    rng = random.Random(3)
    dataset = [[rng.randrange(97) for _ in range(rng.randint(1, 120))] for _ in range(32)]
    mesh: Any = Mesh({"dp": 2, "cp": 2, "tp": 2}, {"dp": 1, "cp": 0, "tp": tp_rank})
    loader = PlannedBatches(
        dataset,
        [len(s) for s in dataset],
        LoaderOptions(global_batch_size=8, profile=PROFILE, seed=3, num_iterations=2),
        mesh=mesh,
    )
    try:
        assert loader.rank == 2
        return [(r.iteration, r.sample_indices, [mb.input_ids.tolist() for mb in r.microbatches]) for r in loader]
    finally:
        loader.close()


def test_tp_peers_get_the_same_microbatches() -> None:
    first = _microbatches(0)
    assert len(first) == 2 and any(mbs for _, _, mbs in first)
    assert _microbatches(1) == first

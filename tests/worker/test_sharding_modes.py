"""One sharding vocabulary for the plan and the worker: every mode the worker may be asked for is a mode
a plan may name, the worker lays out what ``rank_view`` cuts, and a plan's own choice is kept."""

from __future__ import annotations

import pytest

from skrull.solver.errors import RequestError
from skrull.solver.planning import solve
from skrull.solver.sharding import SHARDING_MODES, group_ranges
from skrull.solver.types import Problem
from skrull.solver.worker_view import plan_rank_view
from skrull.worker.layout import check_sharding, layouts_from_view_dict, rank_layouts
from tests.conftest import make_request

BATCHES = [[121, 30, 152, 19], [112, 190, 7, 1, 7], [125, 151, 113, 159, 16, 142, 23, 18, 13, 138, 112]]


def test_the_worker_refuses_a_mode_no_plan_may_name() -> None:
    with pytest.raises(RequestError, match="sharding: 'spiral'"):
        check_sharding("spiral")


@pytest.mark.parametrize("override", SHARDING_MODES)
@pytest.mark.parametrize("solver", ["skrull", "wlb"])
def test_every_mode_lays_out_every_token_once_and_plan_choices_stay(solver: str, override: str) -> None:
    request = make_request(BATCHES, dp=2, cp=2, bucket=100, solver=solver)
    plan = solve(request)
    lengths = Problem.from_request(request).lengths
    for it in plan.iterations:
        held: dict[int, list[tuple[int, int]]] = {}
        for rank in range(plan.parallel.num_gpus):
            layouts = rank_layouts(plan, lengths, iteration=it.index, rank=rank, sharding=override)
            for layout in layouts:
                mb = next(m for m in it.microbatches if m.step == layout.step and m.ranks == layout.ranks)
                mode = mb.sharding if mb.sharding != "zigzag" else override
                expected = group_ranges(mode, [lengths[i] for i in mb.sharded], len(mb.ranks))
                assert [s.ranges for s in layout.sharded] == expected
                for i, n in zip(layout.local_ids, layout.local_lengths, strict=True):
                    held.setdefault(i, []).append((0, n))
                for piece in layout.pieces:
                    held.setdefault(piece.seq_id, []).append((piece.start, piece.end))
        for i, ranges in held.items():
            covered = 0
            for start, end in sorted(ranges):
                assert start == covered
                covered = end
            assert covered == lengths[i]
        assert sorted(held) == sorted(i for mb in it.microbatches for i in mb.seq_ids)


def test_the_loader_reads_a_served_view_into_the_same_layouts() -> None:
    request = make_request(BATCHES, dp=2, cp=2, bucket=100, solver="wlb")
    plan = solve(request)
    lengths = Problem.from_request(request).lengths
    for it in plan.iterations:
        for rank in range(4):
            doc = plan_rank_view(plan, lengths, iteration=it.index, rank=rank).to_dict(plan_id="p")
            _, layouts = layouts_from_view_dict(doc)
            assert layouts == rank_layouts(plan, lengths, iteration=it.index, rank=rank)

"""Every peer plans every bundled length distribution into a valid plan (the issue's target)."""

from __future__ import annotations

import dataclasses

import pytest

from skrull.solver.lengths.datasets import distribution_names, synthesize_request
from skrull.solver.planners.registry import PEERS, get_planner
from skrull.solver.planning import planner_cp_modes, solve
from skrull.solver.profile import load_profile
from skrull.solver.types import Parallel


@pytest.mark.parametrize("dataset", distribution_names())
@pytest.mark.parametrize("peer", PEERS)
def test_peer_plans_bundled_distribution(dataset: str, peer: str) -> None:
    request = synthesize_request(
        dataset=dataset,
        parallel=Parallel(dp=2, cp=4),
        # xtuner shards every pack with Ulysses over the CP group, which must divide the heads: 0.5B has 14
        profile=load_profile("h100-80g/qwen2.5-7b" if peer == "xtuner" else "h100-80g/qwen2.5-0.5b"),
        sequences_per_rank=12,
        num_batches=2,
        seed=1,
    )
    modes = planner_cp_modes(get_planner(peer))  # xtuner plans Ulysses only: the request allows what it plans
    plan = solve(dataclasses.replace(request, solver=peer, time_budget_s=0.2, cp_modes=modes))  # validated by solve
    ran = sorted([i for it in plan.iterations for mb in it.microbatches for i in mb.seq_ids] + list(plan.pending))
    assert ran == list(range(request.num_sequences))

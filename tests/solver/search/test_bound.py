"""The layout-free bound: no planner's iteration beats it, and it is the specification's formula."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skrull.solver.cost import CostModel
from skrull.solver.planners.registry import planner_names
from skrull.solver.planning import solve
from skrull.solver.search.bound import layout_free_bound_ms, microbatch_floor_ms, tight_bound_ms
from skrull.solver.types import Parallel, Request
from tests.conftest import make_request
from tests.solver.search.strategies import one_batch_requests


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(one_batch_requests(20), st.sampled_from([n for n in planner_names() if n not in ("ilp", "ilp-flex", "auto")]))
def test_no_planner_beats_the_layout_free_bound_or_the_microbatch_floor(request: Request, solver: str) -> None:
    plan = solve(dataclasses.replace(request, solver=solver))
    cost = CostModel(request.profile, bucket_tokens=request.bucket_tokens)
    for it in plan.iterations:
        ran = [request.batches[0][i] for mb in it.microbatches for i in mb.seq_ids]
        assert it.estimated_ms >= layout_free_bound_ms(ran, cost, request.parallel) - 1e-9
        assert it.estimated_ms >= microbatch_floor_ms(ran, cost, request.parallel) - 1e-9


def test_microbatch_floor_counts_whole_microbatches_per_gpu() -> None:
    # three 100-token sequences on 2 GPUs with a 100-token bucket: the token average is 1.5 microbatches
    # per GPU, but no token carries more FLOPs than these, so some GPU computes in 2 microbatches
    request = make_request([[100, 100, 100]], dp=1, cp=2, bucket=100)
    cost = CostModel(request.profile, bucket_tokens=100)
    p = request.profile
    a = p.compute.ms_per_tflop / 1e12
    parallel = Parallel(dp=1, cp=2)
    floor = 1.5 * a * cost.flops(100) + 2 * (p.microbatch_ms + p.compute.fixed_ms)
    assert microbatch_floor_ms([100, 100, 100], cost, parallel) == pytest.approx(
        max(floor, tight_bound_ms([100] * 3, cost, parallel))
    )
    assert microbatch_floor_ms([100, 100, 100], cost, parallel) > tight_bound_ms([100, 100, 100], cost, parallel)
    assert microbatch_floor_ms([], cost, parallel) == 0.0


def test_bound_is_the_contract_formula_on_a_hand_case() -> None:
    request = make_request([[10, 150]], dp=2, cp=2, bucket=100)
    cost = CostModel(request.profile, bucket_tokens=100)
    p = request.profile
    a = p.compute.ms_per_tflop / 1e12
    average = a * (cost.flops(10) + cost.flops(150)) / 4 + p.microbatch_ms * 160 / (100 * 4)
    # 150 > bucket: the longest sequence must be sharded, over at most all 4 GPUs
    single = p.microbatch_ms + p.compute.fixed_ms + cost.t_comm_ms(150) + a * cost.flops(150) / 4
    assert layout_free_bound_ms([10, 150], cost, Parallel(dp=2, cp=2)) == pytest.approx(max(average, single))
    assert layout_free_bound_ms([], cost, Parallel(dp=2, cp=2)) == 0.0

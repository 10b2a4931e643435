"""The layout-free bound: no planner's iteration beats it, and it is the specification's formula."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skrull.solver.cost import CostModel
from skrull.solver.io import request_from_dict
from skrull.solver.planning import solve
from skrull.solver.search import bound
from skrull.solver.search.bound import layout_free_bound_ms, microbatch_floor_ms, sharding_floor_ms, tight_bound_ms
from skrull.solver.types import Parallel, Request
from tests.conftest import HAND_PROFILE, allgather_planners, make_request
from tests.solver.ilp.brute_force import flexible_optimum_ms
from tests.solver.search.strategies import one_batch_requests


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    one_batch_requests(20), st.sampled_from([n for n in allgather_planners() if n not in ("ilp", "ilp-flex", "auto")])
)
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


#: The hand profile with FLOPs 100x heavier: a sequence's FLOPs time is then of the order of the
#: per-microbatch costs, so long sequences must be sharded and the sharding floor rises above the floor.
HEAVY = {**HAND_PROFILE, "compute": {**HAND_PROFILE["compute"], "flops_per_token": 1e11, "flops_per_token_sq": 1e7}}


@st.composite
def heavy_or_hand_requests(draw: st.DrawFn, max_size: int = 16) -> Request:
    dp = draw(st.integers(1, 3))
    cp = draw(st.sampled_from([1, 2, 4]))
    bucket = draw(st.integers(10, 200))
    batch = draw(st.lists(st.integers(1, cp * bucket), min_size=1, max_size=max_size))
    profile = draw(st.sampled_from([HAND_PROFILE, HEAVY]))
    doc = {
        "batches": [batch],
        "parallel": {"dp": dp, "cp": cp},
        "profile": {**profile, "memory": {"bucket_tokens": bucket}},
        "solver": "skrull",
        "time_budget_s": 1.0,
    }
    return request_from_dict(doc)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(heavy_or_hand_requests(), st.sampled_from([n for n in allgather_planners() if n not in ("ilp", "ilp-flex")]))
def test_no_planner_beats_the_sharding_floor(request: Request, solver: str) -> None:
    plan = solve(dataclasses.replace(request, solver=solver, time_budget_s=0.2 if solver == "auto" else 1.0))
    cost = CostModel(request.profile, bucket_tokens=request.bucket_tokens)
    for it in plan.iterations:
        ran = [request.batches[0][i] for mb in it.microbatches for i in mb.seq_ids]
        bound = sharding_floor_ms(ran, cost, request.parallel)
        assert bound >= microbatch_floor_ms(ran, cost, request.parallel)
        assert it.estimated_ms >= bound - 1e-9


@st.composite
def tiny_heavy(draw: st.DrawFn) -> tuple[list[int], int, int]:
    gpus = draw(st.integers(2, 3))
    bucket = draw(st.integers(20, 60))
    lengths = draw(st.lists(st.integers(1, gpus * bucket), min_size=1, max_size=4 if gpus == 2 else 3))
    return lengths, gpus, bucket


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_heavy(), st.sampled_from([HAND_PROFILE, HEAVY]))
def test_sharding_floor_never_exceeds_the_optimum_over_every_group(
    case: tuple[list[int], int, int], profile: dict[str, object]
) -> None:
    # every non-empty set of GPUs is a group: the exhaustive optimum is over every layout of 2-3 GPUs
    lengths, gpus, bucket = case
    request = request_from_dict(
        {
            "batches": [lengths],
            "parallel": {"dp": 1, "cp": gpus},
            "profile": {**profile, "memory": {"bucket_tokens": bucket}},
            "solver": "skrull",
        }
    )
    cost = CostModel(request.profile, bucket_tokens=bucket)
    groups = [tuple(r for r in range(gpus) if mask >> r & 1) for mask in range(1, 2**gpus)]
    best = flexible_optimum_ms(lengths, cost, groups, gpus)
    assert sharding_floor_ms(lengths, cost, request.parallel) <= best + 1e-9


def test_sharding_floor_charges_a_second_fixed_cost_to_the_gpus_of_a_sharded_sequence() -> None:
    # one sequence too heavy to run whole within the floor, and two light ones, on 4 GPUs: it is sharded
    # over p >= 2 GPUs, each paying compute.fixed_ms twice (or the communication's fixed cost)
    lengths = [100, 10, 10]
    parallel = Parallel(dp=2, cp=2)
    request = request_from_dict(
        {"batches": [lengths], "parallel": {"dp": 2, "cp": 2}, "profile": HEAVY, "solver": "skrull"}
    )
    cost = CostModel(request.profile, bucket_tokens=100)
    p = request.profile
    a = p.compute.ms_per_tflop / 1e12
    c = p.microbatch_ms + p.compute.fixed_ms
    e = min(p.compute.fixed_ms, p.comm.fixed_ms)
    total = a * sum(cost.flops(s) for s in lengths)
    longest = a * cost.flops(100)
    sharded = min(max(c + (total + k * e) / 4, c + e + longest / k) for k in (2, 3, 4))
    expected = max(microbatch_floor_ms(lengths, cost, parallel), min(c + longest, sharded))
    assert sharding_floor_ms(lengths, cost, parallel) == pytest.approx(expected)
    assert sharding_floor_ms(lengths, cost, parallel) > microbatch_floor_ms(lengths, cost, parallel)
    assert sharding_floor_ms([], cost, parallel) == 0.0
    # one GPU: nothing can be sharded
    assert sharding_floor_ms(lengths, cost, Parallel(dp=1, cp=1)) == microbatch_floor_ms(
        lengths, cost, Parallel(dp=1, cp=1)
    )


@given(
    gpus=st.sampled_from([2, 3, 4, 8, 16, 64, 512]),
    fewest=st.integers(min_value=2, max_value=600),
    a=st.floats(min_value=0.0, max_value=10.0),
    total_ms=st.floats(min_value=0.0, max_value=1e5),
    e=st.one_of(st.just(0.0), st.floats(min_value=0.0, max_value=5.0)),
    share=st.floats(min_value=0.0, max_value=1.0),
)
def test_the_group_size_minimum_is_the_scans(
    gpus: int, fewest: int, a: float, total_ms: float, e: float, share: float
) -> None:
    forced_ms = share * total_ms
    scan = min(
        (max(a + (total_ms + p * e) / gpus, a + e + forced_ms / p) for p in range(fewest, gpus + 1)), default=math.inf
    )
    assert bound._min_over_group_sizes(fewest, gpus, a=a, total_ms=total_ms, e=e, forced_ms=forced_ms) == scan

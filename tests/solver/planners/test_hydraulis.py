"""Hydraulis: replica CP degrees from the length histogram, stage-1 pinning, stage-2 min-max ILP."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from skrull.solver.planners.hydraulis import (
    HydraulisPlanner,
    StrategyCosts,
    assign_sequences,
    candidate_degrees,
    choose_degrees,
    layout_replicas,
    minmax_pack,
)
from skrull.solver.types import Problem, Request
from tests.conftest import HAND_PROFILE, make_request
from tests.solver.planners.peer_requests import planned, requests

#: The hand profile with communication 4x dearer (0.004 ms per token): sharding a short sequence costs
#: more than it saves, so short sequences belong on one GPU.
DEAR_COMM: dict[str, Any] = {**HAND_PROFILE, "comm": {"bytes_per_token": 2**20, "ms_per_mib": 0.004, "fixed_ms": 0.2}}


def degrees_for(lengths: list[int], *, num_gpus: int = 4) -> tuple[int, ...]:
    problem = Problem.from_request(make_request([lengths], dp=1, cp=num_gpus, bucket=100, profile=DEAR_COMM))
    costs = StrategyCosts.from_problem(problem)
    return choose_degrees(lengths, num_gpus=num_gpus, degrees=candidate_degrees(num_gpus, num_gpus), costs=costs)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests(max_len=20))
def test_plans_are_valid_with_replicas_on_disjoint_contiguous_blocks(request: Request) -> None:
    plan = planned(HydraulisPlanner(deterministic=True, ilp_time_limit_s=0.05, shuffles=10), request)
    for it in plan.iterations:
        blocks = {mb.ranks for mb in it.microbatches}
        gpus = [g for block in blocks for g in block]
        assert len(gpus) == len(set(gpus))  # a replica's block is its own for the whole iteration
        assert all(block == tuple(range(block[0], block[0] + len(block))) for block in blocks)


def test_short_sequences_get_one_gpu_replicas() -> None:
    assert degrees_for([50] * 8) == (1, 1, 1, 1)


def test_a_sequence_only_four_gpus_hold_gets_a_four_gpu_replica() -> None:
    assert degrees_for([350] + [50] * 8) == (4,)


def test_mixed_lengths_get_heterogeneous_replicas() -> None:
    # 180 tokens need 2 GPUs (bucket 100). Per range (a*s^2 + b*s per sequence plus the microbatch cost
    # c spread over d*100 tokens; d=1: a=2e-7, b=0.002, c=3.5; d=2: a=1e-7, b=0.005, c=3.7):
    #   (2, 1, 1): four 50s on two 1-GPU replicas: 4 * 1.8505 / 2 + 3.5 = 7.20;
    #              180 on a 2-GPU replica: 0.90324 + 3.7 * 180 / 200 + 3.7 = 7.93  -> max 7.93
    #   (2, 2):    everything on two 2-GPU replicas: (4 * 1.42525 + 4.23324) / 2 + 3.7 = 8.67
    #   (4,):      one 4-GPU replica: slower still (comm on everything, one microbatch cost per 400 tokens)
    assert degrees_for([180] + [50] * 4) == (2, 1, 1)


def test_replicas_are_laid_out_largest_first_and_aligned() -> None:
    assert layout_replicas((1, 4, 2, 1)) == [(0, 1, 2, 3), (4, 5), (6,), (7,)]


def test_stage_one_pins_what_only_the_largest_replica_holds() -> None:
    problem = Problem.from_request(make_request([[150, 150, 20, 20]], dp=1, cp=4, bucket=100))
    costs = StrategyCosts.from_problem(problem)
    members, _ = assign_sequences((0, 1, 2, 3), problem.lengths, (2, 1, 1), costs, shuffles=5, rng=random.Random(0))
    assert sorted(members[0])[:2] == [0, 1]  # both 150s on the 2-GPU replica
    assert all(i in (2, 3) for m in members[1:] for i in m)


def test_stage_two_ilp_beats_greedy_on_a_tiny_case() -> None:
    # LPT: 5 | 4, 3 -> 5+3 | 4+3 -> 8 | 10 (max 10); the optimum is {5, 4} | {3, 3, 3} = 9 | 9.
    where, status = minmax_pack([5, 4, 3, 3, 3], [1] * 5, 2, 100, time_limit_s=5.0, seed=0, deterministic=True)
    assert status == "OPTIMAL"
    assert where is not None
    loads = [sum(w for w, j in zip([5, 4, 3, 3, 3], where, strict=True) if j == mb) for mb in (0, 1)]
    assert max(loads) == 9


def test_stage_two_respects_the_memory_cap() -> None:
    # The balanced split {5, 4} | {3, 3, 3} needs 9 tokens in the first microbatch; cap 8 forbids it.
    where, _ = minmax_pack([5, 4, 3, 3, 3], [5, 4, 3, 3, 3], 2, 9, time_limit_s=5.0, seed=0, deterministic=True)
    assert where is not None
    tokens = [sum(s for s, j in zip([5, 4, 3, 3, 3], where, strict=True) if j == mb) for mb in (0, 1)]
    assert max(tokens) <= 9
    assert minmax_pack([5, 5, 5], [5, 5, 5], 1, 9, time_limit_s=1.0, seed=0, deterministic=True)[0] is None


def test_same_request_same_plan() -> None:
    request = make_request([[180, 150, 90, 60, 50, 40, 30, 20, 10] * 3], dp=2, cp=2, bucket=100)
    planner = HydraulisPlanner(deterministic=True, ilp_time_limit_s=0.2)
    first = planned(planner, request)
    second = planned(planner, request)
    assert first.iterations == second.iterations


def test_stage_two_keeps_the_greedy_packing_once_the_budget_is_spent() -> None:
    where, status = minmax_pack([5, 4, 3, 3, 3], [1] * 5, 2, 100, time_limit_s=0.0, seed=0, deterministic=False)
    assert status == "out-of-time" and where is not None and sorted(set(where)) == [0, 1]


def test_ilps_stop_at_the_budget_deadline_whatever_their_static_share(monkeypatch: Any) -> None:
    """Time already spent (a cold CP-SAT import, say) comes off every ILP's limit: a clock that jumps
    past the deadline after the first reading leaves no ILP to run, and the plan is still valid."""
    import skrull.solver.planners.hydraulis as hydraulis

    readings = iter([100.0])
    monkeypatch.setattr(hydraulis.time, "monotonic", lambda: next(readings, 1e9))
    request = make_request([[90, 80, 70, 60, 50, 45, 40, 35, 30, 25, 20, 15] * 2], dp=2, cp=2, bucket=100)
    problem = Problem.from_request(request)
    out = HydraulisPlanner(ilp_time_limit_s=5.0).plan(problem)
    assert dict(out.stats)["ilp_calls"] == 0.0
    monkeypatch.undo()
    assert planned(HydraulisPlanner(ilp_time_limit_s=5.0), request).iterations  # valid (checked by planned)
    with_ilp = HydraulisPlanner(deterministic=True, ilp_time_limit_s=1.0).plan(problem)
    assert dict(with_ilp.stats)["ilp_calls"] > 0  # the same request does use the ILP when time is left


def test_a_cold_cp_sat_import_counts_against_the_time_left(monkeypatch: Any) -> None:
    import sys

    from skrull.solver.planners.minmax_ilp import COLD_IMPORT_S, CP_SAT_MODULE, import_fits

    __import__(CP_SAT_MODULE)
    assert import_fits(0.0)  # imported: costs nothing more
    monkeypatch.delitem(sys.modules, CP_SAT_MODULE)
    assert not import_fits(COLD_IMPORT_S - 0.01) and import_fits(COLD_IMPORT_S)


def test_the_strategy_dp_in_one_array_chooses_as_the_dp_range_by_range(monkeypatch: Any) -> None:
    # choose_degrees computes each bucket's row in one array up to DP_ARRAY_ELEMENTS, range by range beyond:
    # both must pick the same degrees (ties: the first (j, d, r)), on lengths spread over many buckets
    import skrull.solver.planners.hydraulis as hydraulis

    rng = random.Random(5)
    costs = StrategyCosts.from_problem(Problem.from_request(make_request([[10]], dp=1, cp=64, bucket=100)))
    cases = []
    for _ in range(30):
        num_gpus = rng.choice([4, 8, 16, 32, 64])
        # mostly shorter than a bucket, a few long ones up to the whole group's
        exponents = [
            rng.uniform(-6, 1) if rng.random() < 0.9 else rng.uniform(1, 6) for _ in range(rng.randint(1, 120))
        ]
        lengths = [max(1, min(num_gpus * 100, int(100 * 2**e))) for e in exponents]
        cases.append((lengths, num_gpus, candidate_degrees(num_gpus, rng.choice([1, 2, 4]))))
    one_array = [choose_degrees(ls, num_gpus=g, degrees=d, costs=costs) for ls, g, d in cases]
    monkeypatch.setattr(hydraulis, "DP_ARRAY_ELEMENTS", 0)
    by_range = [choose_degrees(ls, num_gpus=g, degrees=d, costs=costs) for ls, g, d in cases]
    assert one_array == by_range
    assert len({len(set(c)) for c in one_array}) > 1  # homogeneous and heterogeneous choices both occur


def test_the_degree_search_never_counts_more_replicas_than_sequences(monkeypatch: pytest.MonkeyPatch) -> None:
    """12 sequences on DP1 x CP65,536: the histogram DP tries at most as many replicas per range as the range
    has sequences (a replica serves whole sequences), so it takes thousands of vector steps, not millions
    (before: one per replica count up to 65,536 / d for every range and degree; 11.6 s for a 5 s budget)."""
    import numpy as np

    from skrull.solver.planners import hydraulis as hydraulis_module
    from skrull.solver.planners.hydraulis import StrategyCosts, candidate_degrees, choose_degrees

    steps = {"n": 0}
    real_maximum = np.maximum

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        steps["n"] += 1
        if steps["n"] > 100_000:
            raise AssertionError("the degree search ran past 100,000 vector steps")
        return real_maximum(*args, **kwargs)

    monkeypatch.setattr(hydraulis_module.np, "maximum", counted)
    lengths = [60_000, 1_000, 2_000, 500_000, 7_000, 30_000] * 2
    costs = StrategyCosts.from_problem(Problem.from_request(make_request([lengths], dp=1, cp=65_536, bucket=1_000_000)))
    degrees = choose_degrees(lengths, num_gpus=65_536, degrees=candidate_degrees(65_536, 65_536), costs=costs)
    assert sum(degrees) == 65_536
    assert steps["n"] <= 100_000


def test_stage_two_leaves_a_model_too_large_to_build_to_the_greedy_packing() -> None:
    """Stage 2's n x m booleans are built in Python before CP-SAT's time limit starts: 16,384 sequences on
    one replica (8M booleans) took 28 s of a 16 s budget. Beyond ``MAX_MODEL_CELLS`` the greedy stands."""
    from skrull.solver.planners.hydraulis import MAX_MODEL_CELLS, minmax_pack

    n = 2000
    m = MAX_MODEL_CELLS // n + 1
    weights, sizes = [1 + k % 7 for k in range(n)], [10 + k % 13 for k in range(n)]
    where, status = minmax_pack(weights, sizes, m, cap=10_000, time_limit_s=60.0, seed=0, deterministic=False)
    assert status == "too-large" and where is not None
    assert sorted(set(where)) <= list(range(m)) and len(where) == n

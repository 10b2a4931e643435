"""The cost model's public coefficients are the reference model: the terms planners reason with
(``sharded_terms``, ``work_ms``) and ``iteration_ms`` price exactly what the validator checks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skrull.solver.cost import CostModel
from skrull.solver.planning import solve
from skrull.solver.profile import profile_from_dict
from skrull.solver.types import MicrobatchSpec, Problem
from tests.conftest import HAND_PROFILE, allgather_planners, make_request

MODEL = CostModel(profile_from_dict(HAND_PROFILE))


def test_coefficients_are_the_profiles_in_the_models_units() -> None:
    c = MODEL.coefficients
    assert c.ms_per_flop == pytest.approx(2.0 / 1e12)
    assert c.comm_ms_per_token == pytest.approx(0.001 * 2**20 / 2**20)
    assert (c.compute_fixed_ms, c.comm_fixed_ms, c.microbatch_ms, c.bucket_tokens) == (0.5, 0.2, 3.0, 100)
    assert c.flops(10) == MODEL.flops(10) == 1e9 * 10 + 1e5 * 100


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 400), min_size=1, max_size=6), group_size=st.integers(1, 8))
def test_an_all_sharded_microbatch_costs_c_plus_the_sum_of_t(lengths: list[int], group_size: int) -> None:
    c = MODEL.coefficients
    _, _, fixed = c.sharded_terms(group_size)
    expected = fixed + sum(c.sharded_ms(s, group_size) for s in lengths)
    if group_size == 1:  # nothing is sharded on one GPU: the sequences stay whole there
        priced = MODEL.microbatch_time_ms([lengths], [])
    else:
        priced = MODEL.microbatch_time_ms([[] for _ in range(group_size)], lengths)
    assert priced == pytest.approx(expected, rel=1e-12)


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(1, 400), min_size=1, max_size=12))
def test_work_is_the_average_term_of_the_lower_bound(lengths: list[int]) -> None:
    request = make_request([lengths], dp=2, cp=2, bucket=400)
    model = CostModel(request.profile, bucket_tokens=400)
    work = sum(model.coefficients.work_ms(s) for s in lengths) / request.parallel.num_gpus
    longest_only = model.lower_bound_ms([max(lengths)], request.parallel)
    assert model.lower_bound_ms(lengths, request.parallel) == pytest.approx(max(work, longest_only), rel=1e-9)


@pytest.mark.parametrize("solver", [n for n in allgather_planners() if n not in ("ilp", "auto")])
def test_iteration_ms_prices_every_planners_iterations_as_the_plan_does(solver: str) -> None:
    request = make_request([[150, 30, 7, 90, 199], [60, 60, 12]], dp=2, cp=2, bucket=100, solver=solver)
    plan = solve(request)
    model = CostModel(request.profile, bucket_tokens=request.bucket_tokens)
    lengths = Problem.from_request(request).lengths
    for it in plan.iterations:
        assert model.iteration_ms(it.microbatches, lengths, plan.parallel.num_gpus) == it.estimated_ms
        specs = [
            MicrobatchSpec(step=mb.step, ranks=mb.ranks, local=mb.local, sharded=mb.sharded, sharding=mb.sharding)
            for mb in it.microbatches
        ]
        assert model.price_iteration(specs, lengths, parallel=plan.parallel, index=it.index) == it

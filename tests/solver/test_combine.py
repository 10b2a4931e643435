"""Plans solved one batch at a time are assembled in the planning library: for every planner that
declares it streams, the combined plan is the whole-request plan (iterations, pending, objective)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skrull.solver.errors import PlannerBugError
from skrull.solver.planners.registry import get_planner
from skrull.solver.planning import combine_iterations, solve, solve_batch
from tests.conftest import allgather_planners, make_request

STREAMING = [name for name in allgather_planners() if get_planner(name).streams_iterations]


@settings(max_examples=40, deadline=None)
@given(
    batches=st.lists(st.lists(st.integers(1, 190), min_size=1, max_size=10), min_size=1, max_size=4),
    solver=st.sampled_from(STREAMING),
    dp=st.integers(1, 3),
)
def test_combined_batches_are_the_whole_requests_plan(batches: list[list[int]], solver: str, dp: int) -> None:
    request = make_request(batches, dp=dp, cp=2, bucket=100, solver=solver)
    combined = combine_iterations(request, [solve_batch(request, k) for k in range(len(batches))])
    whole = solve(request)
    assert combined.iterations == whole.iterations
    assert combined.pending == whole.pending
    assert combined.solve.objective_ms == pytest.approx(whole.solve.objective_ms, rel=1e-12)
    assert combined.solve.status == whole.solve.status == "heuristic"


def test_a_combined_plan_that_breaks_the_contract_is_a_planner_bug() -> None:
    request = make_request([[10, 20], [30]], dp=1, cp=2, bucket=100)
    first = solve_batch(request, 0)
    # iteration 1 claims batch 0's sequences again: sequence 2 never runs, 0 and 1 run twice
    repeated = dataclasses.replace(first, iteration=dataclasses.replace(first.iteration, index=1))
    with pytest.raises(PlannerBugError, match="more than once"):
        combine_iterations(request, [first, repeated])


def test_bounds_and_statuses_combine_over_the_iterations() -> None:
    request = make_request([[10, 20], [30]], dp=1, cp=2, bucket=100)
    results = [solve_batch(request, k) for k in range(2)]
    bounded = [
        dataclasses.replace(r, status=status, bound_ms=r.iteration.estimated_ms * 0.5)
        for r, status in zip(results, ["optimal", "feasible"], strict=True)
    ]
    plan = combine_iterations(request, bounded)
    assert plan.solve.status == "feasible"
    assert plan.solve.bound_ms == pytest.approx(sum(r.iteration.estimated_ms for r in results) * 0.5)
    assert plan.solve.gap == pytest.approx(0.5)
    assert combine_iterations(
        request, [results[0], dataclasses.replace(results[1], status="timeout")]
    ).solve.status == ("timeout")

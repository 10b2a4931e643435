"""The up-front budget check: every registered planner has a cost, the estimate follows the request's
shape (sequences, batch split, DP and CP degrees) as each planner's work does, and a refusal quotes the
smallest budget that is then accepted."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skrull.solver.errors import RequestError
from skrull.solver.planners.registry import planner_names
from skrull.solver.search.budget import (
    COSTS,
    SAFETY,
    batch_needs_s,
    batch_share_s,
    check_budget,
    estimated_s,
    plans_batch_by_batch,
    smallest_budget_s,
)
from skrull.solver.types import Parallel


def test_every_registered_planner_has_a_measured_cost() -> None:
    assert set(planner_names()) <= set(COSTS)


def test_the_estimate_follows_each_planners_shape() -> None:
    narrow, wide = Parallel(dp=4, cp=8), Parallel(dp=64, cp=8)
    # verl's Karmarkar-Karp splits each DP rank's share: more DP ranks, smaller shares, less work
    assert estimated_s("verl-kk", [8192], narrow) > 5 * estimated_s("verl-kk", [8192], wide)
    # dynamic CP searches groups per sequence over the whole cluster: more GPUs, more work
    assert estimated_s("dynamic-cp", [8192], wide) > 2 * estimated_s("dynamic-cp", [8192], narrow)
    # an all-sharded planner writes and checks one local list per GPU of every microbatch's group
    assert estimated_s("deepspeed", [1024], Parallel(dp=4, cp=64)) > 2 * estimated_s("deepspeed", [1024], narrow)
    # one batch of 8192 costs dynamic CP more than eight of 1024 (its search is quadratic in a batch)
    assert estimated_s("dynamic-cp", [8192], narrow) > 2 * estimated_s("dynamic-cp", [1024] * 8, narrow)
    assert estimated_s("packed", [8192], narrow) == pytest.approx(estimated_s("packed", [1024] * 8, narrow), rel=0.2)


@pytest.mark.parametrize("solver", sorted(COSTS))
def test_a_refusal_quotes_a_budget_that_is_then_accepted(solver: str) -> None:
    sizes, parallel = [4096, 4096], Parallel(dp=16, cp=8)
    need = smallest_budget_s(solver, sizes, parallel)
    whole = SAFETY * estimated_s(solver, sizes, parallel)
    per_batch = sum(batch_needs_s(solver, sizes, parallel))  # a streaming planner solves batch by batch
    assert need == pytest.approx(per_batch if plans_batch_by_batch(solver) else whole)
    with pytest.raises(RequestError) as caught:
        check_budget(solver, sizes, need * 0.9, parallel)
    assert caught.value.field == "time_budget_s"
    quoted = float(str(caught.value).rsplit(">= ", 1)[1])
    check_budget(solver, sizes, quoted, parallel)  # accepted


@settings(max_examples=60, deadline=None)
@given(
    solver=st.sampled_from(["skrull", "packed", "deepspeed", "round-robin"]),
    sizes=st.lists(st.integers(1, 400_000), min_size=1, max_size=12),
    dp=st.integers(1, 64),
    cp=st.integers(1, 64),
    extra=st.floats(1.0, 3.0),
)
def test_a_budget_accepted_for_a_request_is_enough_for_each_batch_as_solved(
    solver: str, sizes: list[int], dp: int, cp: int, extra: float
) -> None:
    """Streaming planners solve batch by batch with shares of the budget (planning.solve_batch): every share
    of an accepted budget passes the check of its batch alone (before: an even split gave a 300,000-sequence
    batch next to a 10-sequence one half of what it needs, after the request had been accepted)."""
    parallel = Parallel(dp=dp, cp=cp)
    budget = smallest_budget_s(solver, sizes, parallel) * extra
    check_budget(solver, sizes, budget, parallel)
    for k, size in enumerate(sizes):
        check_budget(solver, [size], batch_share_s(solver, sizes, k, budget, parallel), parallel)


def test_a_request_without_a_budget_gets_what_its_planner_needs() -> None:
    from skrull.solver.search.budget import (
        EXACT_DEFAULT_TIME_BUDGET_S,
        MAX_DEFAULT_TIME_BUDGET_S,
        default_budget_s,
    )

    small, large = [256], [65536]
    parallel = Parallel(dp=8, cp=64)
    # small requests: one second, or the exact planners' cap (they run until proven optimal or it)
    assert default_budget_s("skrull", small, parallel) == 1.0
    assert default_budget_s("ilp", small, parallel) == default_budget_s("ilp-flex", small, parallel)
    assert default_budget_s("ilp", small, parallel) == EXACT_DEFAULT_TIME_BUDGET_S
    # large ones: raised to the smallest budget the planner keeps, which check_budget then accepts
    need = smallest_budget_s("deepspeed", large, parallel)
    assert need > 1.0
    given = default_budget_s("deepspeed", large, parallel)
    assert need <= given <= need * 1.1
    check_budget("deepspeed", large, given, parallel)
    # never more than the documented maximum
    assert default_budget_s("dynamic-cp", [65536] * 64, Parallel(dp=1024, cp=16)) == MAX_DEFAULT_TIME_BUDGET_S

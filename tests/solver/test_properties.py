"""Invariants over random requests (hypothesis): every planner's plan is valid, every sequence is
placed exactly once, no bucket is ever exceeded, and estimates equal the reference model."""

from __future__ import annotations

import dataclasses
import operator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skrull.solver.cost import CostModel
from skrull.solver.planning import solve
from skrull.solver.types import Plan, Request
from skrull.solver.validate import plan_problems
from tests.conftest import allgather_planners, make_request


@st.composite
def requests(draw: st.DrawFn) -> Request:
    dp = draw(st.integers(1, 4))
    cp = draw(st.integers(1, 8))
    bucket = draw(st.integers(4, 300))
    limit = cp * bucket
    # mix short sequences with ones near the group's limit, where placement is hardest
    length = st.one_of(
        st.integers(1, max(1, bucket // 2)), st.integers(1, limit), st.integers(max(1, limit - 3), limit)
    )
    batches = draw(st.lists(st.lists(length, min_size=1, max_size=40), min_size=1, max_size=3))
    return make_request(batches, dp=dp, cp=cp, bucket=bucket)


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: Planners that spend a time budget are checked on fewer examples with a small budget.
BUDGETED = ("ilp", "ilp-flex", "auto")
FAST = tuple(n for n in allgather_planners() if n not in BUDGETED)


@SETTINGS
@given(requests(), st.sampled_from(FAST))
def test_every_planner_returns_a_valid_plan(request: Request, solver: str) -> None:
    plan = solve(dataclasses.replace(request, solver=solver))  # solve() validates; check again explicitly
    assert plan_problems(plan, request) == []


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests(), st.sampled_from(BUDGETED))
def test_budgeted_planners_return_valid_plans_no_worse_than_skrull(request: Request, solver: str) -> None:
    request = dataclasses.replace(request, time_budget_s=0.3)
    plan = solve(dataclasses.replace(request, solver=solver))
    assert plan_problems(plan, request) == []
    assert plan.estimated_ms <= solve(request).estimated_ms + 1e-9


@SETTINGS
@given(requests())
def test_skrull_places_every_sequence_once_within_the_bucket(request: Request) -> None:
    plan = solve(request)
    lengths = [s for b in request.batches for s in b]
    placed = sorted(i for it in plan.iterations for mb in it.microbatches for i in mb.seq_ids)
    assert placed == list(range(len(lengths)))
    cp = request.parallel.cp
    for it in plan.iterations:
        for mb in it.microbatches:
            assert mb.ranks == request.parallel.cp_group(mb.ranks[0] // cp)
            shard = sum(lengths[i] for i in mb.sharded)
            for ids in mb.local:
                assert len(mb.ranks) * sum(lengths[i] for i in ids) + shard <= len(mb.ranks) * request.bucket_tokens


@SETTINGS
@given(requests(), st.sampled_from(FAST))
def test_estimates_equal_the_reference_model(request: Request, solver: str) -> None:
    plan = solve(dataclasses.replace(request, solver=solver))
    model = CostModel(request.profile, bucket_tokens=request.bucket_tokens)
    lengths = [s for b in request.batches for s in b]
    for it in plan.iterations:
        per_gpu = [0.0] * request.parallel.num_gpus
        for mb in it.microbatches:
            expected = model.microbatch_time_ms(
                [[lengths[i] for i in ids] for ids in mb.local], [lengths[i] for i in mb.sharded]
            )
            assert mb.estimated_ms == expected
            for g in mb.ranks:
                per_gpu[g] += expected
        assert it.estimated_ms == max(per_gpu)
        ran = [lengths[i] for mb in it.microbatches for i in mb.seq_ids]  # planners may defer work (wlb)
        assert it.lower_bound_ms == pytest.approx(model.lower_bound_ms(ran, request.parallel), rel=1e-12)
        assert it.static_bound_ms == pytest.approx(model.static_bound_ms(ran, request.parallel), rel=1e-12)
        assert it.estimated_ms >= it.lower_bound_ms - 1e-9  # valid for every layout
        par = request.parallel
        static = all(mb.ranks == par.cp_group(mb.ranks[0] // par.cp) for mb in it.microbatches)
        if static:  # groups wider than cp (dynamic-cp, hydraulis) may spread the longest beyond this one
            assert it.estimated_ms >= it.static_bound_ms - 1e-9


def _ran(plan: Plan) -> list[list[int]]:
    return [sorted(i for mb in it.microbatches for i in mb.seq_ids) for it in plan.iterations]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_no_plan_of_any_planner_beats_any_planners_bound(request: Request) -> None:
    """``lower_bound_ms`` of every iteration and ``solve.bound_ms`` hold for every layout: no planner's plan
    of the same sequences, static or with wider groups, is faster than any planner's bound (the exact
    planners' bounds included, whatever layout their own model covers)."""
    plans = {
        name: solve(dataclasses.replace(request, solver=name, time_budget_s=0.2 if name in BUDGETED else None))
        for name in allgather_planners()
    }
    for name, plan in plans.items():
        if plan.solve.bound_ms is not None:
            assert plan.solve.bound_ms <= plan.estimated_ms + 1e-9, name
        for other_name, other in plans.items():
            for mine, theirs, same in zip(
                plan.iterations, other.iterations, map(operator.eq, _ran(plan), _ran(other)), strict=True
            ):
                if same:
                    assert mine.lower_bound_ms <= theirs.estimated_ms + 1e-9, (name, other_name)
            if plan.solve.bound_ms is not None and _ran(plan) == _ran(other) and not other.pending:
                assert plan.solve.bound_ms <= other.estimated_ms + 1e-9, (name, other_name)

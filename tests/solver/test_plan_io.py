"""The plan document has one writer and one reader (``solver.io``): every plan, of every planner, reads
back as an equal value, sharding modes, pending ids and solve stats included; bad plan documents name
the field."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skrull.solver.errors import RequestError
from skrull.solver.io import iteration_from_dict, iteration_to_dict, plan_from_dict, plan_to_dict
from skrull.solver.planning import solve
from skrull.solver.sharding import SHARDING_MODES
from skrull.solver.types import SOLVE_STATUSES, Iteration, Microbatch, Parallel, Plan, Request, SolveInfo
from tests.conftest import allgather_planners, make_request


def through_json(plan: Plan) -> Plan:
    return plan_from_dict(json.loads(json.dumps(plan_to_dict(plan))))


@st.composite
def planned_requests(draw: st.DrawFn) -> Request:
    dp = draw(st.integers(1, 3))
    cp = draw(st.integers(1, 4))
    bucket = draw(st.integers(8, 200))
    length = st.one_of(st.integers(1, bucket), st.integers(1, cp * bucket))
    batches = draw(st.lists(st.lists(length, min_size=1, max_size=16), min_size=1, max_size=3))
    solver = draw(st.sampled_from(allgather_planners()))
    return make_request(batches, dp=dp, cp=cp, bucket=bucket, solver=solver, time_budget_s=0.2, deterministic=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(planned_requests())
def test_every_planners_plan_reads_back_as_an_equal_value(request: Request) -> None:
    plan = solve(request)
    assert through_json(plan) == plan


def test_wlb_plans_keep_their_sharding_modes_pending_ids_and_stats() -> None:
    # outliers still queued after the last batch are pending; both of WLB's sharding modes are chosen
    batches = [[121, 30, 152, 19], [112, 190, 7, 1, 7], [125, 151, 113, 159, 16, 142, 23, 18, 13, 138, 112]]
    plan = solve(make_request(batches, dp=2, cp=2, bucket=100, solver="wlb"))
    assert {mb.sharding for it in plan.iterations for mb in it.microbatches} == {"per-sequence", "per-document"}
    assert plan.pending and plan.solve.stats
    assert through_json(plan) == plan


finite = st.floats(min_value=0.0, max_value=1e9, allow_nan=False, allow_infinity=False)
ids = st.lists(st.integers(0, 2**40), max_size=4).map(tuple)


@st.composite
def microbatches(draw: st.DrawFn) -> Microbatch:
    ranks = tuple(draw(st.lists(st.integers(0, 2**20), min_size=1, max_size=4, unique=True)))
    return Microbatch(
        step=draw(st.integers(0, 2**31)),
        ranks=ranks,
        local=tuple(draw(ids) for _ in ranks),
        sharded=draw(ids),
        estimated_ms=draw(finite),
        sharding=draw(st.sampled_from(SHARDING_MODES)),
    )


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    iterations = tuple(
        Iteration(
            index=k,
            microbatches=tuple(draw(st.lists(microbatches(), max_size=3))),
            estimated_ms=draw(finite),
            lower_bound_ms=draw(finite),
        )
        for k in range(draw(st.integers(0, 3)))
    )
    bound = draw(st.none() | finite)
    return Plan(
        solver=draw(st.text(max_size=12)),
        parallel=Parallel(dp=draw(st.integers(1, 2**16)), cp=draw(st.integers(1, 2**16))),
        bucket_tokens=draw(st.integers(1, 2**40)),
        iterations=iterations,
        pending=draw(ids),
        solve=SolveInfo(
            wall_ms=draw(finite),
            status=draw(st.sampled_from(SOLVE_STATUSES)),
            objective_ms=draw(finite),
            bound_ms=bound,
            gap=None if bound is None else draw(finite),
            stats=tuple(draw(st.dictionaries(st.text(max_size=8), finite, max_size=3)).items()),
        ),
    )


@settings(max_examples=200, deadline=None)
@given(plans())
def test_any_plan_value_survives_the_document(plan: Plan) -> None:
    assert through_json(plan) == plan
    for it in plan.iterations:
        assert iteration_from_dict(json.loads(json.dumps(iteration_to_dict(it)))) == it


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("iterations",), {"0": 1}, "iterations"),
        (("iterations", 0), [], "iterations[0]"),
        (("iterations", 0, "microbatches", 0), "mb", "iterations[0].microbatches[0]"),
        (("iterations", 0, "microbatches", 0, "estimated_ms"), math.nan, "iterations[0].microbatches[0].estimated_ms"),
        (("iterations", 0, "microbatches", 0, "estimated_ms"), "1.5", "iterations[0].microbatches[0].estimated_ms"),
        (("iterations", 0, "microbatches", 0, "ranks", 0), -1, "iterations[0].microbatches[0].ranks[0]"),
        (("iterations", 0, "microbatches", 0, "local"), {"a": 1}, "iterations[0].microbatches[0].local"),
        (("iterations", 0, "microbatches", 0, "sharding"), "striped", "iterations[0].microbatches[0].sharding"),
        (("iterations", 0, "index"), True, "iterations[0].index"),
        (("solve",), None, "solve"),
        (("solve", "stats"), {"x": math.inf}, "solve.stats.x"),
        (("solve", "gap"), "0.1", "solve.gap"),
        (("solver",), 3, "solver"),
        (("pending",), [0, -1], "pending[1]"),
        (("pending",), [2**70], "pending[0]"),
    ],
)
def test_a_bad_plan_document_names_the_field(path: tuple[Any, ...], value: Any, field: str) -> None:
    doc = plan_to_dict(solve(make_request([[10, 150, 30]], dp=1, cp=2, bucket=100)))
    target: Any = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(RequestError) as err:
        plan_from_dict(doc)
    assert err.value.field == field

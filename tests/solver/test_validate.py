"""The validator catches every kind of contract violation a planner could make."""

from __future__ import annotations

import dataclasses

import pytest

from skrull.solver.errors import InvalidPlanError
from skrull.solver.planners.base import make_spec
from skrull.solver.planning import solve
from skrull.solver.types import Microbatch, Plan
from skrull.solver.validate import plan_problems, validate_plan
from tests.conftest import make_request


def _replace_mb(plan: Plan, k: int, **changes: object) -> Plan:
    it = plan.iterations[0]
    mbs = list(it.microbatches)
    mbs[k] = dataclasses.replace(mbs[k], **changes)  # type: ignore[arg-type]
    return dataclasses.replace(plan, iterations=(dataclasses.replace(it, microbatches=tuple(mbs)),))


@pytest.fixture
def request_and_plan() -> tuple:
    request = make_request([[30, 40, 50, 60]], dp=1, cp=2, bucket=100, solver="deepspeed")
    return request, solve(request)


def test_valid_plan_has_no_problems(request_and_plan: tuple) -> None:
    request, plan = request_and_plan
    assert plan_problems(plan, request) == []


def test_catches_missing_and_repeated_sequences(request_and_plan: tuple) -> None:
    request, plan = request_and_plan
    first = plan.iterations[0].microbatches[0]
    bad = _replace_mb(plan, 1, sharded=first.sharded)
    problems = plan_problems(bad, request)
    assert any("never scheduled: [1]" in p for p in problems)
    assert any("more than once: [0]" in p for p in problems)


def test_catches_bucket_overflow(request_and_plan: tuple) -> None:
    request, plan = request_and_plan
    # 60 tokens whole on one GPU and 50 sharded: 60 + 25 = 85 <= 100 fits; 110 whole does not
    mb = plan.iterations[0].microbatches[0]
    bad = _replace_mb(plan, 0, local=((0, 1, 2, 3), ()), sharded=())
    bad = dataclasses.replace(
        bad, iterations=(dataclasses.replace(bad.iterations[0], microbatches=(bad.iterations[0].microbatches[0],)),)
    )
    problems = plan_problems(bad, request)
    assert any("over bucket_tokens=100" in p for p in problems), problems
    assert mb.ranks == (0, 1)


def test_catches_wrong_estimate(request_and_plan: tuple) -> None:
    request, plan = request_and_plan
    mb = plan.iterations[0].microbatches[2]
    bad = _replace_mb(plan, 2, estimated_ms=mb.estimated_ms + 0.5)
    with pytest.raises(InvalidPlanError) as err:
        validate_plan(bad, request)
    assert any("estimated_ms" in p and "reference" in p for p in err.value.problems)


def test_catches_two_microbatches_at_one_step(request_and_plan: tuple) -> None:
    request, plan = request_and_plan
    bad = _replace_mb(plan, 1, step=0)
    assert any("two microbatches at step 0" in p for p in plan_problems(bad, request))


def test_catches_sharding_on_one_gpu_and_bad_ranks() -> None:
    request = make_request([[10, 20]], dp=2, cp=1, solver="deepspeed")
    plan = solve(request)
    bad = _replace_mb(plan, 0, local=((),), sharded=(0,))
    assert any("one-GPU group" in p for p in plan_problems(bad, request))
    bad = _replace_mb(plan, 0, ranks=(5,))
    assert any("distinct GPUs in 0..1" in p for p in plan_problems(bad, request))


def test_catches_sequence_run_before_its_batch() -> None:
    request = make_request([[10], [20]], dp=1, cp=1, solver="deepspeed")
    plan = solve(request)
    it0, it1 = plan.iterations
    moved = Microbatch(step=1, ranks=(0,), local=((1,),), sharded=(), estimated_ms=it1.microbatches[0].estimated_ms)
    bad = dataclasses.replace(
        plan,
        iterations=(
            dataclasses.replace(it0, microbatches=(*it0.microbatches, moved)),
            dataclasses.replace(it1, microbatches=()),
        ),
    )
    assert any("runs early" in p for p in plan_problems(bad, request))


def test_catches_inconsistent_solve_block(request_and_plan: tuple) -> None:
    request, plan = request_and_plan
    bad = dataclasses.replace(plan, solve=dataclasses.replace(plan.solve, objective_ms=1.0, bound_ms=2.0, gap=0.1))
    problems = plan_problems(bad, request)
    assert any("objective_ms" in p for p in problems)
    assert any("bound_ms" in p for p in problems)
    bad = dataclasses.replace(plan, solve=dataclasses.replace(plan.solve, model_bound_ms=1e9, model_gap=0.0))
    assert any("model_bound_ms" in p for p in plan_problems(bad, request))


def test_bounds_are_the_reference_figures_and_named_apart(request_and_plan: tuple) -> None:
    # a plan that reports the static bound as its lower bound (what plans did before the two were named
    # apart) is refused: lower_bound_ms holds for every layout, static_bound_ms for the static one
    request, plan = request_and_plan
    it = plan.iterations[0]
    assert it.static_bound_ms is not None and it.static_bound_ms != pytest.approx(it.lower_bound_ms)
    swapped = dataclasses.replace(
        plan,
        iterations=(dataclasses.replace(it, lower_bound_ms=it.static_bound_ms, static_bound_ms=it.lower_bound_ms),),
    )
    problems = plan_problems(swapped, request)
    assert any(p.startswith("iterations[0]: lower_bound_ms") for p in problems)
    assert any(p.startswith("iterations[0]: static_bound_ms") for p in problems)
    # a plan written elsewhere may leave the static bound out
    assert (
        plan_problems(dataclasses.replace(plan, iterations=(dataclasses.replace(it, static_bound_ms=None),)), request)
        == []
    )


def _one_microbatch_plan(request_batches: list[list[int]], *, local: tuple, sharded: tuple, bucket: int) -> tuple:
    """A plan of one microbatch over GPUs 0 and 1, priced by the reference model."""
    from skrull.solver.cost import CostModel

    request = make_request(request_batches, dp=1, cp=2, bucket=bucket)
    model = CostModel(request.profile, bucket_tokens=bucket)
    lengths = [s for b in request_batches for s in b]
    it = model.price_iteration(
        [make_spec(step=0, ranks=(0, 1), local=local, sharded=sharded)], lengths, parallel=request.parallel, index=0
    )
    plan = solve(request)
    objective = it.estimated_ms
    solve_info = dataclasses.replace(plan.solve, objective_ms=objective, bound_ms=None, gap=None)
    return request, dataclasses.replace(plan, iterations=(it,), solve=solve_info)


def test_memory_is_checked_in_the_tokens_each_gpu_really_holds() -> None:
    # 19 sharded tokens over 2 GPUs, zigzag: 4 chunks of 4, 3 dealt (to GPU 0, 1, 0): GPU 0 holds 10, GPU 1 9.
    # One local token fits beside GPU 1's 9 pieces (10 <= 10) although the average share (9.5) says 10.5.
    request, plan = _one_microbatch_plan([[1, 19]], local=((), (0,)), sharded=(1,), bucket=10)
    assert plan_problems(plan, request) == []
    # On GPU 0 it does not: 1 + 10 = 11, and the problem names the GPU and its real count.
    request, plan = _one_microbatch_plan([[1, 19]], local=((0,), ()), sharded=(1,), bucket=10)
    assert plan_problems(plan, request) == [
        "iterations[0].microbatches[0]: GPU 0 holds 11 tokens, over bucket_tokens=10"
    ]

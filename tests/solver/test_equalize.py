"""``equal_microbatches``: every planner's plan gives every GPU the same number of microbatches in every
iteration, by empty microbatches that cost ``microbatch_ms`` and change nothing else; the validator
holds plans to it, and the request format carries it."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skrull.solver.cost import CostModel
from skrull.solver.equalize import equalize_microbatches, microbatch_counts, step_sets
from skrull.solver.errors import RequestError
from skrull.solver.io import read_json, request_from_dict, request_to_dict
from skrull.solver.planning import solve
from skrull.solver.types import MicrobatchSpec, Parallel, Request
from skrull.solver.validate import plan_problems
from tests.solver.test_properties import BUDGETED, FAST, requests

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def non_empty(plan_iterations: object) -> list[list[object]]:
    return [[mb for mb in it.microbatches if mb.seq_ids] for it in plan_iterations]  # type: ignore[attr-defined]


@SETTINGS
@given(requests(), st.sampled_from(FAST))
def test_every_planner_gives_every_gpu_the_same_count_and_changes_nothing_else(request: Request, solver: str) -> None:
    plain = solve(dataclasses.replace(request, solver=solver))
    equal_request = dataclasses.replace(request, solver=solver, equal_microbatches=True)
    plan = solve(equal_request)
    assert plan_problems(plan, equal_request) == []
    for it in plan.iterations:  # aligned: every GPU's k-th microbatch at the same step, so equal counts
        assert len(set(step_sets(it.microbatches, request.parallel.num_gpus))) == 1
        assert len(set(microbatch_counts(it.microbatches, request.parallel.num_gpus))) == 1
    # only empty microbatches were added: the placements are the unconstrained plan's, whole
    assert non_empty(plan.iterations) == non_empty(plain.iterations)
    assert plan.pending == plain.pending
    mb_ms = CostModel(request.profile, bucket_tokens=request.bucket_tokens).microbatch_overhead_ms
    assert all(mb.estimated_ms == mb_ms for it in plan.iterations for mb in it.microbatches if not mb.seq_ids)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests(), st.sampled_from(BUDGETED))
def test_budgeted_planners_honour_it_too(request: Request, solver: str) -> None:
    equal_request = dataclasses.replace(request, solver=solver, time_budget_s=0.3, equal_microbatches=True)
    plan = solve(equal_request)
    assert plan_problems(plan, equal_request) == []
    assert all(len(set(microbatch_counts(it.microbatches, request.parallel.num_gpus))) == 1 for it in plan.iterations)


def test_every_gpu_gets_a_microbatch_at_every_step_one_empty_per_idle_cp_group() -> None:
    par = Parallel(dp=2, cp=2)
    specs = [
        MicrobatchSpec(step=0, ranks=(0, 1), local=((0,), ()), sharded=(1,)),
        MicrobatchSpec(step=1, ranks=(0, 1), local=((2,), (3,)), sharded=()),
        MicrobatchSpec(step=2, ranks=(0,), local=((4,),), sharded=()),
        MicrobatchSpec(step=0, ranks=(2, 3), local=((5,), (6,)), sharded=()),
    ]
    padded = equalize_microbatches(specs, par)
    assert padded[: len(specs)] == specs
    # at every step, each idle GPU gets an empty microbatch (one over a whole idle CP group)
    assert padded[len(specs) :] == [
        MicrobatchSpec(step=1, ranks=(2, 3), local=((), ()), sharded=()),
        MicrobatchSpec(step=2, ranks=(1,), local=((),), sharded=()),
        MicrobatchSpec(step=2, ranks=(2, 3), local=((), ()), sharded=()),
    ]
    assert microbatch_counts(padded, par.num_gpus) == [3, 3, 3, 3]
    assert step_sets(padded, par.num_gpus) == [frozenset({0, 1, 2})] * 4


def test_the_validator_holds_plans_to_the_request() -> None:
    request = request_from_dict(read_json("examples/requests/mooncake-dp4-cp8.json"))
    equal = dataclasses.replace(request, solver="skrull", equal_microbatches=True)  # 7 vs 9 per GPU
    padded = solve(equal)
    plain = solve(dataclasses.replace(equal, equal_microbatches=False))
    assert any(len(set(microbatch_counts(it.microbatches, 32))) > 1 for it in plain.iterations)
    # the unconstrained plan breaks the promise; the padded one breaks the plain request's "no empty" rule
    assert any(
        "equal_microbatches asks every GPU for a microbatch at every step" in p for p in plan_problems(plain, equal)
    )
    assert any(
        "holds no sequence" in p for p in plan_problems(padded, dataclasses.replace(equal, equal_microbatches=False))
    )


def test_the_request_format_carries_it_and_names_a_bad_value() -> None:
    doc = read_json("examples/requests/contract-example.json")
    request = request_from_dict({**doc, "equal_microbatches": True})
    assert request.equal_microbatches and request_to_dict(request)["equal_microbatches"] is True
    assert "equal_microbatches" not in request_to_dict(request_from_dict(doc))
    with pytest.raises(RequestError) as caught:
        request_from_dict({**doc, "equal_microbatches": "yes"})
    assert (caught.value.field, caught.value.value) == ("equal_microbatches", "yes")


@pytest.mark.parametrize(("idle_gpu_is_slowest", "status"), [(False, "optimal"), (True, "feasible")])
def test_a_proof_of_optimality_survives_padding_only_when_the_padding_costs_nothing(
    idle_gpu_is_slowest: bool, status: str
) -> None:
    from skrull.solver.planners.base import PlannerOutput
    from skrull.solver.planning import equalized
    from skrull.solver.types import Problem
    from tests.conftest import make_request

    # GPU 0 runs two microbatches, GPU 1 one: GPU 1 gets an empty one (microbatch_ms, 3 ms) at step 1, which
    # costs time only if GPU 1's one microbatch is within 3 ms of GPU 0's two (7.04 ms)
    long_on_1 = 300 if idle_gpu_is_slowest else 10
    problem = Problem.from_request(make_request([[10, 10, long_on_1]], dp=2, cp=1, bucket=300))
    specs = (
        MicrobatchSpec(step=0, ranks=(0,), local=((0,),), sharded=()),
        MicrobatchSpec(step=1, ranks=(0,), local=((1,),), sharded=()),
        MicrobatchSpec(step=0, ranks=(1,), local=((2,),), sharded=()),
    )
    out = equalized(PlannerOutput(iterations=(specs,), status="optimal", bound_ms=1.0), problem)
    assert out.iterations[0][3:] == (MicrobatchSpec(step=1, ranks=(1,), local=((),), sharded=()),)
    assert out.status == status

"""The exact model over flexible layouts (``ilp-flex``): optimal on tiny instances, never worse than
the static optimum or ``auto``, bounds below objectives."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skrull.solver.cost import CostModel
from skrull.solver.ilp.builder import Layout, build_joint_model, interchangeable_singles
from skrull.solver.planners.exact_flexible import flexible_groups, to_groups
from skrull.solver.planning import solve
from skrull.solver.types import Parallel, Request
from skrull.solver.validate import plan_problems
from tests.conftest import make_request
from tests.solver.ilp.brute_force import flexible_optimum_ms


@st.composite
def tiny(draw: st.DrawFn) -> Request:
    dp = draw(st.integers(1, 2))
    cp = draw(st.integers(1, 2))
    bucket = draw(st.integers(20, 60))
    lengths = draw(st.lists(st.integers(1, cp * bucket), min_size=1, max_size=4))
    return make_request([lengths], dp=dp, cp=cp, bucket=bucket, time_budget_s=4.0, solver="ilp-flex")


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny(), st.sampled_from(["cpsat", "scip"]))
def test_flexible_optimum_equals_exhaustive_enumeration(request: Request, backend: str) -> None:
    plan = solve(dataclasses.replace(request, backend=backend))
    assert plan_problems(plan, request) == []
    cost = CostModel(request.profile, bucket_tokens=request.bucket_tokens)
    groups = flexible_groups(request.parallel)
    best = flexible_optimum_ms(list(request.batches[0]), cost, groups, request.parallel.num_gpus)
    assert plan.solve.status == "optimal"
    assert plan.estimated_ms == pytest.approx(best, rel=1e-6, abs=1e-6)
    assert plan.solve.bound_ms is not None and plan.solve.bound_ms <= plan.estimated_ms + 1e-9


def test_flexible_model_beats_the_static_optimum_when_a_wide_group_pays() -> None:
    # one long sequence and a few short ones on DP2 x CP1: sharding the long one over both GPUs wins,
    # which no static plan (each GPU its own group) can do
    request = make_request([[190, 5, 6]], dp=2, cp=1, bucket=200, time_budget_s=4.0)
    static = solve(dataclasses.replace(request, solver="ilp"))
    flexible = solve(dataclasses.replace(request, solver="ilp-flex"))
    auto = solve(dataclasses.replace(request, solver="auto"))
    assert static.solve.status == "optimal" and flexible.solve.status == "optimal"
    assert flexible.estimated_ms <= static.estimated_ms + 1e-9
    assert flexible.estimated_ms <= auto.estimated_ms + 1e-9


def test_flexible_warm_start_satisfies_every_constraint() -> None:
    request = make_request([[30, 45, 7, 90, 12]], dp=2, cp=2, bucket=60, solver="auto", time_budget_s=0.5)
    plan = solve(request)
    specs = plan.iterations[0].microbatches
    groups = flexible_groups(Parallel(dp=2, cp=2), [mb.ranks for mb in specs])
    built = build_joint_model(
        seq_ids=range(5),
        lengths=[30, 45, 7, 90, 12],
        num_groups=len(groups),
        group_size=2,
        cost=CostModel(request.profile, bucket_tokens=60),
        hint=to_groups(specs, groups),  # type: ignore[arg-type]
        layout=Layout.of_groups(groups, 4),
    )
    values = [built.model.hint[v] for v in range(built.model.num_vars)]
    assert built.model.violated(values) == []
    assert built.model.objective_value(values) <= plan.estimated_ms * 10_000
    # the warm start decodes back to itself, up to the order of a group's ranks (symmetry breaking)

    def canonical(grps: list[list[tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]]]) -> list[list[Any]]:
        return [sorted((sorted(local), sharded) for local, sharded in grp) for grp in grps]

    # and up to which of two interchangeable GPUs takes which own group's microbatches (symmetry-gpus)
    decoded, hinted = canonical(built.decode(values)), canonical(to_groups(specs, groups))  # type: ignore[arg-type]
    layout = Layout.of_groups(groups, 4)
    runs = interchangeable_singles(layout, [0] * 4)
    for run in runs:
        assert sorted(decoded[g] for g in run) == sorted(hinted[g] for g in run)
    others = [g for g in range(len(groups)) if not any(g in run for run in runs)]
    assert [decoded[g] for g in others] == [hinted[g] for g in others]


def test_interchangeable_singles_are_gpus_that_share_every_wider_group() -> None:
    groups = flexible_groups(Parallel(dp=2, cp=2))  # singles 0..3, (0, 1), (2, 3), (0, 1, 2, 3)
    assert interchangeable_singles(Layout.of_groups(groups, 4), [0] * 4) == [[0, 1], [2, 3]]
    # a group (1, 2) tells every GPU apart; so does time outside the model
    wider = flexible_groups(Parallel(dp=2, cp=2), [(1, 2)])
    assert interchangeable_singles(Layout.of_groups(wider, 4), [0] * 4) == []
    assert interchangeable_singles(Layout.of_groups(groups, 4), [0, 5, 0, 0]) == [[2, 3]]


def test_interchangeable_gpus_are_ordered_by_their_own_groups_time() -> None:
    # the hint puts the heavier single-GPU work on GPU 1: the model's hint moves it to GPU 0, which
    # satisfies the order (and every other constraint)
    groups = flexible_groups(Parallel(dp=2, cp=2))
    hint: list[list[Any]] = [[] for _ in groups]
    hint[0] = [(((2,),), ())]  # 7 tokens alone on GPU 0
    hint[1] = [(((0, 4),), ())]  # 30 + 12 tokens on GPU 1
    hint[2] = [(((1,),), ())]  # 45 tokens on GPU 2 (GPU 3 has none of its own: already in order)
    hint[6] = [(((), (), (), ()), (3,))]  # 90 tokens sharded over all four
    request = make_request([[30, 45, 7, 90, 12]], dp=2, cp=2, bucket=60)
    built = build_joint_model(
        seq_ids=range(5),
        lengths=[30, 45, 7, 90, 12],
        num_groups=len(groups),
        group_size=2,
        cost=CostModel(request.profile, bucket_tokens=60),
        hint=hint,
        layout=Layout.of_groups(groups, 4),
    )
    assert built.model.families()["symmetry-gpus"] == 2
    values = [built.model.hint[v] for v in range(built.model.num_vars)]
    assert built.model.violated(values) == []
    decoded = built.decode(values)
    assert decoded[0] == [(((0, 4),), ())] and decoded[1] == [(((2,),), ())]
    assert decoded[2] == [(((1,),), ())] and decoded[3] == []

"""The exact model over flexible layouts (``ilp-flex``): optimal on tiny instances, never worse than
the static optimum or ``auto``, bounds below objectives."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skrull.solver.cost import CostModel
from skrull.solver.ilp.builder import Layout, build_joint_model
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

    assert canonical(built.decode(values)) == canonical(to_groups(specs, groups))  # type: ignore[arg-type]

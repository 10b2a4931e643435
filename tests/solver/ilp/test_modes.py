"""The CP mode as a decision of the exact model: with all-gather and Ulysses allowed, ``ilp`` and ``ilp-flex``
find the optimum over plans whose microbatches each run their cheaper allowed mode (checked against
exhaustive enumeration with the reference model priced in each mode), and their bounds hold for it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skrull.solver.cost import CostModel
from skrull.solver.ilp.builder import Layout, build_joint_model
from skrull.solver.io import request_from_dict
from skrull.solver.planners.exact import specs_to_groups
from skrull.solver.planners.exact_flexible import flexible_groups
from skrull.solver.planning import solve
from skrull.solver.profile import profile_from_dict
from skrull.solver.types import Request
from skrull.solver.validate import plan_problems
from tests.conftest import HAND_PROFILE
from tests.solver.ilp.brute_force import flexible_optimum_ms, optimum_ms

#: All-gather at 0.02 ms per sharded token and 0.2 ms fixed; the all-to-all at 0.01 ms per token of T/N and
#: 2.5 ms fixed: on two GPUs a microbatch sharding fewer than about 153 tokens is cheaper in all-gather, one
#: sharding more in Ulysses, so the best plans mix the modes.
MODES_PROFILE: dict[str, Any] = {
    **HAND_PROFILE,
    "comm": {"bytes_per_token": 2**20, "ms_per_mib": 0.02, "fixed_ms": 0.2},
    "heads": {"attention": 8, "kv": 2},
    "comm_a2a": {"bytes_per_token": 2**20, "ms_per_mib": 0.01, "fixed_ms": 2.5},
}
BOTH = ("allgather", "ulysses")


def make(
    lengths: list[int], *, dp: int, cp: int, bucket: int, modes: tuple[str, ...], solver: str, heads: int = 8
) -> Request:
    profile = {**MODES_PROFILE, "heads": {"attention": heads, "kv": 2}, "memory": {"bucket_tokens": bucket}}
    doc = {
        "batches": [lengths],
        "parallel": {"dp": dp, "cp": cp},
        "profile": profile,
        "solver": solver,
        "cp_modes": list(modes),
        "time_budget_s": 5.0,
        "deterministic": True,
    }
    return request_from_dict(doc)


def modes_used(plan: Any) -> set[str]:
    return {mb.mode for it in plan.iterations for mb in it.microbatches if mb.sharded and len(mb.ranks) > 1}


@st.composite
def tiny(draw: st.DrawFn) -> tuple[list[int], int, int, int, tuple[str, ...]]:
    dp = draw(st.integers(1, 2))
    cp = draw(st.sampled_from([1, 2]))
    bucket = draw(st.integers(40, 120))
    lengths = draw(st.lists(st.integers(1, cp * bucket), min_size=1, max_size=4))
    modes = draw(st.sampled_from([BOTH, ("ulysses",)]))
    return lengths, dp, cp, bucket, modes


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny(), st.sampled_from(["cpsat", "scip"]))
def test_ilp_optimum_over_the_modes_equals_exhaustive_enumeration(
    case: tuple[list[int], int, int, int, tuple[str, ...]], backend: str
) -> None:
    lengths, dp, cp, bucket, modes = case
    request = make(lengths, dp=dp, cp=cp, bucket=bucket, modes=modes, solver="ilp")
    request = dataclasses.replace(request, backend=backend)
    plan = solve(request)
    assert plan_problems(plan, request) == []
    reference = CostModel(request.profile, bucket_tokens=bucket)
    best = optimum_ms(lengths, reference, dp=dp, cp=cp, modes=modes)
    assert plan.solve.status == "optimal"
    assert plan.estimated_ms == pytest.approx(best, rel=1e-6, abs=1e-6)
    assert plan.solve.model_bound_ms is not None and plan.solve.model_bound_ms <= plan.estimated_ms + 1e-9
    assert plan.solve.bound_ms is not None and plan.solve.bound_ms <= best + 1e-9


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny(), st.sampled_from([8, 6]))
def test_ilp_flex_optimum_over_the_modes_equals_exhaustive_enumeration(
    case: tuple[list[int], int, int, int, tuple[str, ...]], heads: int
) -> None:
    # with 6 heads a group of 4 cannot run Ulysses: under Ulysses alone it may hold whole sequences only
    lengths, dp, cp, bucket, modes = case
    request = make(lengths, dp=dp, cp=cp, bucket=bucket, modes=modes, solver="ilp-flex", heads=heads)
    plan = solve(request)
    assert plan_problems(plan, request) == []
    reference = CostModel(request.profile, bucket_tokens=bucket)
    groups = flexible_groups(request.parallel)
    best = flexible_optimum_ms(lengths, reference, groups, request.parallel.num_gpus, modes=modes)
    assert plan.solve.status == "optimal"
    assert plan.estimated_ms == pytest.approx(best, rel=1e-6, abs=1e-6)
    assert plan.solve.bound_ms is not None and plan.solve.bound_ms <= best + 1e-9


@pytest.mark.parametrize("lengths", [[182, 148, 37, 147], [29, 30, 136, 191]])
def test_the_exact_plan_mixes_modes_where_that_beats_either_mode_alone(lengths: list[int]) -> None:
    # Two sharded microbatches, one long (cheaper in Ulysses) and one short (cheaper in all-gather): choosing
    # the mode after an all-gather solve left 21.0118 ms on the first batch where the optimum is 20.9968 ms
    request = make(lengths, dp=1, cp=2, bucket=100, modes=BOTH, solver="ilp")
    plan = solve(request)
    assert plan_problems(plan, request) == []
    reference = CostModel(request.profile, bucket_tokens=100)
    best = optimum_ms(lengths, reference, dp=1, cp=2, modes=BOTH)
    alone = min(optimum_ms(lengths, reference, dp=1, cp=2, modes=(m,)) for m in BOTH)
    assert best < alone - 0.05
    assert plan.estimated_ms == pytest.approx(best, rel=1e-6, abs=1e-6)
    assert modes_used(plan) == set(BOTH)
    assert plan.solve.status == "optimal" and plan.solve.model_gap is not None and plan.solve.model_gap <= 1e-4


def _mode_model(request: Request, view: CostModel, layout: Layout | None = None) -> Any:
    lengths = list(request.batches[0])
    specs = solve(dataclasses.replace(request, solver="skrull")).iterations[0].microbatches
    hint = specs_to_groups(specs, request.parallel)  # type: ignore[arg-type]
    return build_joint_model(
        seq_ids=range(len(lengths)),
        lengths=lengths,
        num_groups=request.parallel.dp,
        group_size=request.parallel.cp,
        cost=view,
        hint=hint,
        layout=layout,
    ), hint


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, 200), min_size=1, max_size=8),
    dp=st.integers(1, 2),
    cp=st.sampled_from([2, 4]),
    modes=st.sampled_from([BOTH, ("ulysses",), ("allgather",)]),
)
def test_the_warm_start_with_its_modes_satisfies_every_constraint(
    lengths: list[int], dp: int, cp: int, modes: tuple[str, ...]
) -> None:
    request = make(lengths, dp=dp, cp=cp, bucket=100, modes=modes, solver="skrull")
    view = CostModel(request.profile, bucket_tokens=100, choose_modes=modes)
    built, hint = _mode_model(request, view)
    values = [built.model.hint[v] for v in range(built.model.num_vars)]
    assert built.model.violated(values) == []

    # its objective is the hint's time as it runs (each microbatch in its cheapest mode), floored
    def ms(local: Any, sharded: Any) -> float:
        return view.microbatch_time_ms([[lengths[i] for i in ids] for ids in local], [lengths[i] for i in sharded])

    hinted_ms = max(sum(ms(local, sharded) for local, sharded in g) for g in hint)
    slots = sum(len(g) for g in hint)
    assert hinted_ms - slots * 8e-4 <= built.model.objective_value(values) / 10_000 <= hinted_ms + 1e-9
    # a mode decision per microbatch exactly where both modes run (2 and 4 divide the 8 heads)
    assert (built.model.families().get("link-mode", 0) > 0) == (modes == BOTH)


def test_a_group_no_allowed_mode_runs_shards_nothing() -> None:
    # Ulysses alone, 6 heads: a group of 4 may hold whole sequences but has no sharding variables
    request = make([30, 45, 7, 90], dp=2, cp=2, bucket=100, modes=("ulysses",), solver="skrull", heads=6)
    view = CostModel(request.profile, bucket_tokens=100, choose_modes=("ulysses",))
    assert view.view_modes(4) == () and view.view_modes(2) == ("ulysses",) and view.view_modes(1) == ()
    layout = Layout.of_groups([(0, 1), (2, 3), (0, 1, 2, 3)], 4)
    built, _ = _mode_model(request, view, layout)
    assert {g for (_k, g, _m) in built.z} == {0, 1}
    assert any(g == 2 for (_k, g, _m, _j) in built.y)


def test_the_reference_view_models_all_gather_alone() -> None:
    profile = profile_from_dict({**MODES_PROFILE, "memory": {"bucket_tokens": 100}})
    assert CostModel(profile).view_modes(4) == ("allgather",)
    assert CostModel(profile, choose_modes=BOTH).view_modes(4) == BOTH
    assert CostModel(profile, choose_modes=BOTH).view_modes(3) == ("allgather",)  # 3 does not divide 8 heads


@pytest.mark.parametrize("modes", [("allgather",), BOTH])
def test_the_lower_bound_row_never_cuts_a_plan_that_meets_the_bound(modes: tuple[str, ...]) -> None:
    # one sequence sharded over two GPUs is its own optimum, and the layout-free bound meets it; the model's
    # floored coefficients price it a few units below that bound, which the row must allow (it made the
    # model infeasible for 56 of 99 lengths, and ilp reported "feasible" at a zero gap)
    from skrull.solver.search.bound import layout_free_bound_ms
    from skrull.solver.types import Parallel

    compute = {**MODES_PROFILE["compute"], "fixed_ms": 0.123456}
    profile = profile_from_dict({**MODES_PROFILE, "compute": compute, "memory": {"bucket_tokens": 100}})
    view = CostModel(profile, bucket_tokens=100, choose_modes=modes)
    for length in range(101, 200):
        hint = [[(((), ()), (0,))]]
        lower = layout_free_bound_ms([length], view, Parallel(dp=1, cp=2))
        built = build_joint_model(
            seq_ids=[0], lengths=[length], num_groups=1, group_size=2, cost=view, hint=hint, lower_bound_ms=lower
        )
        assert built.model.violated([built.model.hint[v] for v in range(built.model.num_vars)]) == [], length


def test_padding_that_costs_time_only_at_ulysses_prices_drops_optimal() -> None:
    # equal_microbatches pads the DP ranks' microbatch counts; the padding lands on the GPUs that become the
    # slowest only once the cheaper mode prices the sharded microbatches: "optimal" must go (it stayed)
    from skrull.solver.planners.base import PlannerOutput, make_spec
    from skrull.solver.planning import equalized
    from skrull.solver.search.improve import iteration_ms
    from skrull.solver.types import Problem

    profile = {
        **MODES_PROFILE,
        "compute": {"flops_per_token": 0, "flops_per_token_sq": 1e8, "ms_per_tflop": 2.0, "fixed_ms": 0.5},
        "comm": {"bytes_per_token": 2**20, "ms_per_mib": 0.2, "fixed_ms": 0.2},
        "comm_a2a": {"bytes_per_token": 2**20, "ms_per_mib": 0.001, "fixed_ms": 0.1},
        "memory": {"bucket_tokens": 100},
    }
    lengths = [100, 100] + [10] * 40
    request = request_from_dict(
        {"batches": [lengths], "parallel": {"dp": 2, "cp": 2}, "profile": profile, "solver": "ilp",
         "cp_modes": list(BOTH), "equal_microbatches": True}
    )  # fmt: skip
    problem = dataclasses.replace(Problem.from_request(request), cp_modes=BOTH)
    specs = (
        make_spec(step=0, ranks=(0, 1), local=[[0], [1]], sharded=[]),
        make_spec(step=0, ranks=(2, 3), local=[[], []], sharded=list(range(2, 22))),
        make_spec(step=1, ranks=(2, 3), local=[[], []], sharded=list(range(22, 42))),
    )
    view = CostModel(problem.profile, bucket_tokens=100, choose_modes=BOTH)
    before = iteration_ms(specs, problem.lengths, view, 4)
    padded = equalized(PlannerOutput(iterations=(specs,), status="optimal", bound_ms=before), problem)
    assert iteration_ms(padded.iterations[0], problem.lengths, view, 4) > before + 1e-6  # the padding costs
    assert padded.status == "feasible"


#: Links far apart, so a group's link decides where its sequences go: a group of two GPUs on one node
#: gathers at 0.005 ms per MiB, across nodes at 0.1 (three GPUs a node: with DP2 x CP2, GPUs 0-1 share a
#: node, 2-3 do not).
TOPOLOGY: dict[str, Any] = {
    "gpus_per_node": 3,
    "intra_node": {"allgather_ms_per_mib": 0.005, "alltoall_ms_per_mib": 0.004},
    "inter_node": {"allgather_ms_per_mib": 0.1, "alltoall_ms_per_mib": 0.08},
    "source": "test figures",
}
OVERLAPS: tuple[dict[str, Any] | None, ...] = (
    None,
    {"with": "local_attention", "ulysses_exposed": 0.5},
    {"with": "local_compute", "ulysses_exposed": 1.0},
)


def with_topology(request: Request, overlap: dict[str, Any] | None) -> Request:
    doc = {**request.profile.to_dict(), "topology": TOPOLOGY}
    if overlap is not None:
        doc["overlap"] = overlap
    return dataclasses.replace(request, profile=profile_from_dict(doc))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny(), st.sampled_from(OVERLAPS))
def test_ilp_optimum_with_topology_and_overlap_equals_exhaustive_enumeration(
    case: tuple[list[int], int, int, int, tuple[str, ...]], overlap: dict[str, Any] | None
) -> None:
    lengths, dp, cp, bucket, modes = case
    request = with_topology(make(lengths, dp=dp, cp=cp, bucket=bucket, modes=modes, solver="ilp"), overlap)
    plan = solve(request)
    assert plan_problems(plan, request) == []
    reference = CostModel(request.profile, bucket_tokens=bucket)
    links = [reference.link_of(request.parallel.cp_group(d)) for d in range(dp)]
    best = optimum_ms(lengths, reference, dp=dp, cp=cp, modes=modes, links=links)
    assert plan.solve.status == "optimal"
    assert plan.estimated_ms == pytest.approx(best, rel=1e-6, abs=1e-6)
    assert plan.solve.model_bound_ms is not None and plan.solve.model_bound_ms <= plan.estimated_ms + 1e-9
    assert plan.solve.bound_ms is not None and plan.solve.bound_ms <= best + 1e-9


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny(), st.sampled_from(OVERLAPS))
def test_ilp_flex_optimum_with_topology_and_overlap_equals_exhaustive_enumeration(
    case: tuple[list[int], int, int, int, tuple[str, ...]], overlap: dict[str, Any] | None
) -> None:
    lengths, dp, cp, bucket, modes = case
    request = with_topology(make(lengths, dp=dp, cp=cp, bucket=bucket, modes=modes, solver="ilp-flex"), overlap)
    plan = solve(request)
    assert plan_problems(plan, request) == []
    reference = CostModel(request.profile, bucket_tokens=bucket)
    groups = flexible_groups(request.parallel)
    best = flexible_optimum_ms(lengths, reference, groups, request.parallel.num_gpus, modes=modes)
    assert plan.solve.status == "optimal"
    assert plan.estimated_ms == pytest.approx(best, rel=1e-6, abs=1e-6)
    assert plan.solve.bound_ms is not None and plan.solve.bound_ms <= best + 1e-9


def test_the_exact_model_keeps_a_group_across_nodes_from_sharding_where_a_node_mate_can() -> None:
    # DP2 x CP2 on nodes of three GPUs: DP rank 0's group (0, 1) is inside a node, rank 1's (2, 3) is not;
    # one sequence too long for a bucket must shard, and the optimum shards it where the link is fast
    request = with_topology(make([150, 20], dp=2, cp=2, bucket=100, modes=("allgather",), solver="ilp"), None)
    plan = solve(request)
    assert plan_problems(plan, request) == []
    assert plan.solve.status == "optimal"
    (sharding,) = [mb for it in plan.iterations for mb in it.microbatches if mb.sharded]
    assert sharding.ranks == (0, 1) and sharding.link == "intra_node"

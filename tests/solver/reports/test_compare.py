"""``compare``: every planner's row carries the peers' metrics, and the speedup stays fair to deferral."""

from __future__ import annotations

import dataclasses

import pytest

from skrull.solver.cost import CostModel
from skrull.solver.lengths.datasets import synthesize_request
from skrull.solver.metrics import work_ms
from skrull.solver.planning import solve
from skrull.solver.profile import load_profile
from skrull.solver.reports.compare import compare, default_solvers, format_table, parse_solver_spec
from skrull.solver.types import Parallel
from tests.conftest import allgather_planners, make_request


def test_every_planner_gets_imbalance_peak_bucket_pending_and_planning_time() -> None:
    request = synthesize_request(
        dataset="mooncake",
        parallel=Parallel(dp=2, cp=4),
        profile=load_profile("h100-80g/qwen2.5-0.5b"),
        sequences_per_rank=16,
        num_batches=2,
        seed=3,
    )
    rows, plans = compare(dataclasses.replace(request, time_budget_s=0.3))
    assert [r.solver for r in rows] == default_solvers(request)
    assert {parse_solver_spec(r.solver)[0] for r in rows} == set(allgather_planners())
    for row in rows:
        assert row.error is None
        assert row.imbalance_degree is not None and row.imbalance_degree >= 1.0 - 1e-9
        assert row.peak_bucket_use is not None and 0.0 < row.peak_bucket_use <= 1.0 + 1e-9
        assert row.pending == len(plans[row.solver].pending)
        assert row.planning_ms is not None and row.planning_ms > 0
        assert row.iteration_ms is not None and row.makespan_ms is not None
        assert row.makespan_ms >= row.iteration_ms - 1e-6
        # the layout-free bound holds for every plan, flexible ones included
        assert row.ratio_to_bound is not None and row.ratio_to_bound >= 1.0 - 1e-9
        assert row.layout in ("static", "flexible")
    assert {r.layout for r in rows if r.solver.startswith("ilp(")} == {"static"}
    wlb = next(r for r in rows if r.solver == "wlb")
    assert wlb.avg_delay_iterations is not None
    table = format_table(rows)
    assert "imbalance" in table and "peak bucket" in table and "delay it" in table


def test_speedup_is_time_per_work_so_deferring_work_does_not_count_as_speed() -> None:
    request = synthesize_request(
        dataset="llama3-sft-mix",
        parallel=Parallel(dp=2, cp=2),
        profile=load_profile("h100-80g/qwen2.5-0.5b"),
        sequences_per_rank=8,
        num_batches=1,
    )
    rows, plans = compare(request, ["skrull", "wlb", "deepspeed"])
    model = CostModel(request.profile, bucket_tokens=request.bucket_tokens)
    lengths = [s for b in request.batches for s in b]
    ref = plans["deepspeed"]
    for row in rows:
        own = plans[row.solver]
        ref_rate = ref.estimated_ms / work_ms(ref, lengths, model)
        assert row.speedup == pytest.approx(ref_rate / (own.estimated_ms / work_ms(own, lengths, model)))
        if not own.pending:  # every sequence runs: the plain time ratio
            assert row.speedup == pytest.approx(ref.estimated_ms / own.estimated_ms)


def test_work_is_additive_over_the_sequences_a_plan_runs() -> None:
    request = make_request([[40, 60, 100]], dp=1, cp=2, bucket=100)
    plan = solve(request)
    model = CostModel(request.profile, bucket_tokens=100)
    # hand profile: ms_per_flop 2e-12, FLOPs(S) = 1e9 S + 1e5 S^2, microbatch 3 ms per 100 tokens, 2 GPUs
    expected = sum(2e-12 * (1e9 * s + 1e5 * s * s) + 3.0 * s / 100 for s in (40, 60, 100)) / 2
    assert work_ms(plan, [40, 60, 100], model) == pytest.approx(expected)


def test_a_planner_that_raises_anything_is_its_rows_error_not_the_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    from skrull.solver.io import read_json, request_from_dict
    from skrull.solver.planners import registry

    class Broken:
        name = "test-broken-compare"
        streams_iterations = True

        def plan(self, problem: object) -> object:
            raise KeyError("SOME_SETTING")

    monkeypatch.setitem(registry._REGISTRY, "test-broken-compare", Broken)
    request = request_from_dict(read_json("examples/requests/contract-example.json"))
    rows, plans = compare(request, ["skrull", "test-broken-compare"])
    by_name = {r.solver: r for r in rows}
    assert by_name["skrull"].status == "heuristic" and "skrull" in plans
    assert by_name["test-broken-compare"].status == "error"
    assert by_name["test-broken-compare"].error == "planner 'test-broken-compare' failed: KeyError: 'SOME_SETTING'"

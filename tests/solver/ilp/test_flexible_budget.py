"""``ilp-flex`` counts the model's preparation in its budget: an iteration with no time left for a model
keeps its warm start without building the model's layout, and the plan of a request whose budget runs out
early is still whole and valid."""

from __future__ import annotations

import dataclasses
import time

import pytest

from skrull.solver.planners import exact_flexible
from skrull.solver.planners.exact_flexible import FlexibleIlpPlanner, _Preparation, _warm_start
from skrull.solver.planning import solve
from skrull.solver.types import Problem
from skrull.solver.validate import plan_problems
from tests.conftest import make_request


def test_an_iteration_past_its_deadline_keeps_its_warm_start_and_prepares_no_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    request = make_request([[30, 45, 7, 90, 120, 15]], dp=2, cp=2, solver="ilp-flex", time_budget_s=4.0)
    problem = Problem.from_request(request)
    ids = tuple(range(len(request.batches[0])))
    start = _warm_start(problem, ids, 0, time.monotonic() + 1.0)

    def no_layout(*_: object) -> None:
        raise AssertionError("the model was prepared with no time left to solve it")

    monkeypatch.setattr(exact_flexible, "_layout", no_layout)
    specs, bound, status = FlexibleIlpPlanner()._solve(problem, ids, start, time.monotonic() - 1.0, 0.0)
    assert specs == start and status in ("optimal", "feasible") and bound >= 0
    # the same when the last preparation took longer than the time left
    prep = _Preparation(seconds=3600.0)
    specs, _, _ = FlexibleIlpPlanner()._solve(problem, ids, start, time.monotonic() + 5.0, 0.0, prep=prep)
    assert specs == start


@pytest.mark.slow  # 12 iterations, each spending its whole (smallest) budget: seconds of wall time
def test_a_request_whose_budget_runs_out_early_is_still_planned_whole() -> None:
    batches = [[20 + (7 * k + 3 * b) % 150 for k in range(12)] for b in range(12)]
    request = make_request(batches, dp=2, cp=2, solver="ilp-flex")
    request = dataclasses.replace(request, time_budget_s=request.resolved_time_budget_s)  # the smallest accepted
    plan = solve(request)
    assert plan_problems(plan, request) == []
    assert len(plan.iterations) == len(batches)

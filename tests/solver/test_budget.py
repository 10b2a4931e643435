"""The budget rule's one module (solver/budget.py): each planner declares its needs on itself (the Protocol's
``budget``), a request resolves its missing budget once when it is built, and the names that moved from
``solver.search.budget`` are still read there, with a warning, by no module of the library."""

from __future__ import annotations

import ast
import dataclasses
import warnings
from pathlib import Path

import pytest

from skrull.solver import budget
from skrull.solver.planners.base import Cost
from skrull.solver.planners.registry import get_planner, planner_names
from skrull.solver.types import Request
from tests.conftest import make_request

ROOT = Path(__file__).resolve().parents[2]


def test_every_built_in_planner_declares_its_needs_and_the_rule_reads_them_from_it() -> None:
    for name in planner_names():
        declared = get_planner(name).budget
        assert isinstance(declared, Cost), name
        assert budget.COSTS[name] is declared
        assert budget.estimated_s(name, [512, 64]) == declared.seconds([512, 64]) > 0
    assert budget.estimated_s("no-such-planner", [512]) == 0.0


def test_a_planner_that_declares_no_needs_gets_no_floor_and_the_default_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from skrull.solver.planners import registry

    class Plain:
        name = "test-plain-budget"

        def plan(self, problem: object) -> object:
            raise NotImplementedError

    monkeypatch.setitem(registry._REGISTRY, "test-plain-budget", registry.solved_whole(Plain))
    assert get_planner("test-plain-budget").budget is None
    assert budget.smallest_budget_s("test-plain-budget", [4096, 4096]) == 0.0
    assert budget.default_budget_s("test-plain-budget", [4096]) == budget.DEFAULT_TIME_BUDGET_S


def test_a_request_without_a_budget_resolves_its_default_once_when_it_is_built() -> None:
    request = make_request([[40] * 300, [70] * 200], dp=2, cp=2, solver="deepspeed")
    expected = budget.default_budget_s("deepspeed", [300, 200], request.parallel)
    assert request.time_budget_s is None and request.default_time_budget_s == expected
    assert request.resolved_time_budget_s == expected
    named = dataclasses.replace(request, time_budget_s=7.5)
    assert named.default_time_budget_s is None and named.resolved_time_budget_s == 7.5
    # the default belongs to the request's planner: another planner's request resolves its own
    exact = dataclasses.replace(request, solver="ilp")
    assert exact.resolved_time_budget_s == budget.EXACT_DEFAULT_TIME_BUDGET_S
    assert request == dataclasses.replace(request)  # the resolved figure is no part of the request's value


def test_the_names_that_moved_are_read_from_the_old_module_with_a_warning() -> None:
    import skrull.solver.search.budget as old

    with pytest.warns(DeprecationWarning, match=r"search\.budget\.smallest_budget_s moved to .*solver\.budget"):
        moved = old.smallest_budget_s
    assert moved is budget.smallest_budget_s
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert old.microbatch_reserve_s(10) == budget.microbatch_reserve_s(10)  # still its home: no warning
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = old.no_such_name


def test_no_module_of_the_library_reads_a_moved_name_from_the_old_module() -> None:
    import skrull.solver.search.budget as old

    readers = []
    for package in ("solver", "api", "cli", "worker", "corpus"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module == "skrull.solver.search.budget":
                    readers += [f"{path.relative_to(ROOT)}: {a.name}" for a in node.names if a.name in old.MOVED]
    assert readers == []


def test_request_stays_importable_from_types_and_plan_types_from_both() -> None:
    from skrull.solver import plan, types

    assert types.Problem is plan.Problem and types.Plan is plan.Plan and types.Parallel is plan.Parallel
    assert Request is types.Request

"""The CLI tells a planner bug (exit status 3) from a user mistake (exit status 2)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from skrull.cli.main import EXIT_PLANNER_BUG, EXIT_USER_ERROR, main
from skrull.solver.planners import registry
from skrull.solver.planners.base import PlannerOutput
from skrull.solver.planners.skrull import SkrullPlanner
from skrull.solver.types import Problem
from tests.conftest import HAND_PROFILE


class DoublingPlanner:
    """Places every sequence twice: the validator refuses the plan."""

    name = "doubling"
    streams_iterations = False

    def plan(self, problem: Problem) -> PlannerOutput:
        output = SkrullPlanner().plan(problem)
        return PlannerOutput(iterations=tuple(specs + specs for specs in output.iterations))


@pytest.fixture
def doubling() -> Iterator[None]:
    saved = dict(registry._REGISTRY)
    registry.register("doubling", DoublingPlanner)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)


def request_file(tmp_path: Path, **changes: object) -> str:
    doc = {"batches": [[10, 20, 150]], "parallel": {"dp": 1, "cp": 2}, "profile": HAND_PROFILE, **changes}
    path = tmp_path / "request.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return str(path)


def test_an_invalid_plan_from_a_planner_exits_3_with_one_line(
    doubling: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["plan", "--request", request_file(tmp_path), "--solver", "doubling"])
    out, err = capsys.readouterr()
    assert status == EXIT_PLANNER_BUG == 3
    assert out == "" and err.startswith("skrull: planner bug: planner 'doubling' produced an invalid plan")
    assert len(err.strip().splitlines()) == 1


def test_a_user_mistake_still_exits_2(doubling: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["plan", "--request", request_file(tmp_path, batches=[[10, 201]])])
    assert status == EXIT_USER_ERROR == 2
    assert "batches[0][1]" in capsys.readouterr().err

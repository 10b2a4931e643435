"""Solving a stored job: batch-by-batch solving publishes iterations that add up to exactly the plan the
planner makes for the whole request, and a retried job resumes after what was published."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skrull.api.schemas import canonical_request_json
from skrull.api.solvers.job_solving import combine_records, solve_job
from skrull.api.store.base import IterationRecord
from skrull.solver.errors import PlannerBugError
from skrull.solver.io import plan_from_dict, plan_to_dict, request_from_dict
from skrull.solver.planners.registry import get_planner
from skrull.solver.planning import combined_status, solve, streams_iterations
from skrull.solver.validate import plan_problems
from tests.api.conftest import plan_request
from tests.conftest import allgather_planners

STREAMED = frozenset(name for name in allgather_planners() if get_planner(name).streams_iterations)

#: Lengths up to 100 tokens fit one GPU of the hand profile (bucket 100), so every cp is placeable.
BATCHES = st.lists(st.lists(st.integers(1, 100), min_size=1, max_size=12), min_size=1, max_size=5)


def run(
    doc: dict[str, Any], *, done: list[IterationRecord] | None = None
) -> tuple[dict[str, Any], list[IterationRecord], list[IterationRecord]]:
    published: list[IterationRecord] = []

    def publish(record: IterationRecord) -> bool:
        published.append(record)
        return True

    canonical = canonical_request_json(request_from_dict(doc))
    plan_json, rest = solve_job("job", canonical, done=done or [], publish=publish)
    return json.loads(plan_json), published, rest


@settings(max_examples=30, deadline=None)
@given(batches=BATCHES, solver=st.sampled_from(sorted(STREAMED)), dp=st.integers(1, 3), cp=st.integers(1, 4))
def test_batch_by_batch_solving_equals_solving_the_whole_request(
    batches: list[list[int]], solver: str, dp: int, cp: int
) -> None:
    doc = plan_request(batches, dp=dp, cp=cp, solver=solver)
    streamed, published, rest = run(doc)
    whole = plan_to_dict(solve(request_from_dict(doc)))
    assert streamed["iterations"] == whole["iterations"]
    assert streamed["pending"] == whole["pending"]
    assert streamed["solve"]["objective_ms"] == pytest.approx(whole["solve"]["objective_ms"], abs=1e-5)
    assert streamed["solve"]["status"] == "heuristic"
    assert [r.index for r in published + rest] == list(range(len(batches)))
    assert [json.loads(r.doc_json) for r in published + rest] == streamed["iterations"]
    assert plan_problems(plan_from_dict(streamed), request_from_dict(doc)) == []


def test_the_planners_declare_which_of_them_stream() -> None:
    assert {"skrull", "deepspeed", "packed", "round-robin"} == STREAMED
    assert not streams_iterations("sorted") and not streams_iterations("wlb")


def test_planners_that_do_not_stream_are_solved_whole() -> None:
    doc = plan_request([[10, 20], [30]], solver="sorted", seed=4)
    plan, published, rest = run(doc)
    assert published == [] and [r.index for r in rest] == [0, 1]
    assert plan["iterations"] == plan_to_dict(solve(request_from_dict(doc)))["iterations"]


def test_a_retried_job_resumes_after_the_iterations_already_published() -> None:
    doc = plan_request([[10, 20], [30, 40], [50]])
    first, published, _ = run(doc)
    calls: list[int] = []
    resumed, again, rest = run(doc, done=published[:2])
    calls.extend(r.index for r in again + rest)
    assert calls == [2]
    assert resumed["iterations"] == first["iterations"]


def test_an_assembled_plan_that_breaks_the_contract_is_refused() -> None:
    doc = plan_request([[10, 20], [30]])
    _, published, rest = run(doc)
    broken = json.loads(rest[0].doc_json)
    broken["microbatches"][0]["sharded"] = broken["microbatches"][0]["sharded"] + [0]
    records = [*published, IterationRecord(**{**_fields(rest[0]), "doc_json": json.dumps(broken)})]
    with pytest.raises(PlannerBugError):
        combine_records(request_from_dict(doc), records)


def _fields(record: IterationRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in record.__slots__}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("statuses", "bound", "expected"),
    [
        (["heuristic", "heuristic"], False, "heuristic"),
        (["optimal", "optimal"], True, "optimal"),
        (["optimal", "feasible"], True, "feasible"),
        (["optimal", "timeout"], True, "timeout"),
    ],
)
def test_the_whole_plans_status_combines_the_batches(statuses: list[str], bound: bool, expected: str) -> None:
    assert combined_status(statuses, bound_known=bound) == expected

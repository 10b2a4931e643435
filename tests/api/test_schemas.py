"""Converters between the wire formats and the solver's types."""

from __future__ import annotations

import json

from skrull.api.schemas import (
    PlanEnvelope,
    PlanModel,
    canonical_request_json,
    envelope_json,
    job_id_for,
)
from skrull.api.store.base import JobRecord
from skrull.solver.io import plan_to_dict, request_from_dict
from skrull.solver.planning import solve
from tests.api.conftest import HAND_PROFILE, plan_request


def test_the_plan_id_is_the_content_address_of_the_request() -> None:
    doc = plan_request([[10, 20]])
    same = json.loads(json.dumps({k: doc[k] for k in sorted(doc)}))
    named_default = {**doc, "time_budget_s": 1.0, "seed": 0}
    other = plan_request([[10, 21]])
    ids = [job_id_for(canonical_request_json(request_from_dict(d))) for d in (doc, same, named_default, other)]
    assert ids[0] == ids[1] == ids[2] != ids[3]
    assert len(ids[0]) == 32


def test_the_canonical_request_inlines_the_profile() -> None:
    canonical = json.loads(canonical_request_json(request_from_dict(plan_request([[5]]))))
    assert canonical["profile"]["compute"] == HAND_PROFILE["compute"]
    # a request that names no budget is stored with its planner's default: the job's hard limit needs it
    assert request_from_dict(canonical) == request_from_dict(plan_request([[5]], time_budget_s=1.0))


def test_the_plan_schema_describes_sharding_modes_and_solve_stats() -> None:
    doc = plan_to_dict(solve(request_from_dict(plan_request([[150, 30, 60, 90, 10], [9]], dp=2, cp=2, solver="wlb"))))
    assert any("sharding" in mb for it in doc["iterations"] for mb in it["microbatches"])
    model = PlanModel.model_validate(doc)
    assert model.model_dump(by_alias=True, exclude_unset=True) == doc


def test_the_envelope_matches_its_schema_in_every_state() -> None:
    plan_json = json.dumps(plan_to_dict(solve(request_from_dict(plan_request([[10, 20]])))))
    problem = json.dumps({"type": "urn:skrull:problem:x", "title": "t", "status": 500, "detail": "d"})
    base = dict(
        job_id="abc",
        solver="skrull",
        num_iterations=1,
        iterations_solved=0,
        num_sequences=2,
        num_gpus=4,
        time_budget_s=1.0,
        attempts=0,
        plan_json=None,
        error_json=None,
        last_error_json=None,
        created_at=1.0,
        updated_at=1.0,
        started_at=None,
        finished_at=None,
        lease_owner=None,
        lease_expires=None,
    )
    for status, extra in (
        ("queued", {}),
        ("solving", {"attempts": 2, "last_error_json": problem}),
        ("solved", {"plan_json": plan_json, "iterations_solved": 1}),
        ("failed", {"error_json": problem}),
    ):
        record = JobRecord(**{**base, **extra, "status": status})  # type: ignore[arg-type]
        envelope = PlanEnvelope.model_validate_json(envelope_json(record))
        assert envelope.status == status
        assert (envelope.plan is not None) == (status == "solved")
        assert (envelope.error is not None) == (status == "failed")


def test_the_request_model_and_the_librarys_reader_know_the_same_fields() -> None:
    # the pydantic model checks shape at the edge, then hands off to the one reader (solver.io); a field
    # added to one and not the other would be refused, or silently dropped, by the service alone
    from skrull.api.schemas import CompareRequestIn, ParallelModel, PlanRequestIn
    from skrull.solver.io import DEFAULT_PROFILE, DEFAULT_SOLVER, PARALLEL_FIELDS, REQUEST_FIELDS

    assert set(PlanRequestIn.model_fields) == REQUEST_FIELDS
    assert set(CompareRequestIn.model_fields) == REQUEST_FIELDS | {"solvers"}
    assert set(ParallelModel.model_fields) == PARALLEL_FIELDS
    from skrull.api.schemas import DeferModel
    from skrull.solver.io import DEFER_FIELDS

    assert set(DeferModel.model_fields) == DEFER_FIELDS
    defaults = {name: field.default for name, field in PlanRequestIn.model_fields.items()}
    # no budget: left out of the document, so the library gives the planner's default for the request's size
    assert (defaults["profile"], defaults["solver"], defaults["time_budget_s"]) == (
        DEFAULT_PROFILE,
        DEFAULT_SOLVER,
        None,
    )

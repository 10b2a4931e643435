"""A budget the planner cannot keep is refused at submission (422 on ``time_budget_s``, quoting the
smallest budget that works); that budget is then accepted."""

from __future__ import annotations

from pathlib import Path

from skrull.api.schemas import ProblemModel
from tests.api.conftest import plan_request, running_app


def test_a_budget_too_small_for_the_planner_is_refused_at_submission(tmp_path: Path) -> None:
    doc = plan_request([[50] * 200], solver="dynamic-cp", time_budget_s=0.001)
    with running_app(tmp_path / "skrull.db") as client:
        r = client.post("/v1/plans", json=doc)
        assert r.status_code == 422, r.text
        problem = ProblemModel.model_validate(r.json())
        assert problem.field == "time_budget_s" and problem.value == 0.001
        assert problem.type.endswith("budget-too-small")
        quoted = float(problem.detail.rsplit(">= ", 1)[1])
        ok = client.post("/v1/plans", json={**doc, "time_budget_s": quoted})
        assert ok.status_code == 202, ok.text


def test_a_request_without_a_budget_is_planned_with_its_planners_default(tmp_path: Path) -> None:
    from skrull.api.schemas import PlanEnvelope

    with running_app(tmp_path / "skrull.db", max_time_budget_s=5.0) as client:
        # the heuristic's default is one second: the same plan (id) as naming it
        doc = plan_request([[50, 120, 30]], solver="skrull")
        r = client.post("/v1/plans", json=doc)
        assert r.status_code == 202, r.text
        assert r.json()["id"] == client.post("/v1/plans", json={**doc, "time_budget_s": 1.0}).json()["id"]
        done = client.get(f"/v1/plans/{r.json()['id']}", params={"wait": 30, "until": "final"})
        envelope = PlanEnvelope.model_validate(done.json())
        assert envelope.status == "solved" and envelope.plan is not None
        # ilp's default (run until optimal, at most 60 s) is capped by what this server allows
        exact = plan_request([[50, 120, 30]], solver="ilp")
        capped = client.post("/v1/plans", json=exact).json()["id"]
        assert capped == client.post("/v1/plans", json={**exact, "time_budget_s": 5.0}).json()["id"]


def test_a_request_without_a_budget_that_needs_more_than_the_server_allows_is_refused(tmp_path: Path) -> None:
    doc = plan_request([[50] * 200], solver="dynamic-cp")
    with running_app(tmp_path / "skrull.db", max_time_budget_s=0.01) as client:
        r = client.post("/v1/plans", json=doc)
        assert r.status_code == 422, r.text
        problem = ProblemModel.model_validate(r.json())
        assert problem.field == "time_budget_s" and problem.value is None
        assert problem.type.endswith("limit-exceeded") and "SKRULL_MAX_TIME_BUDGET_S" in problem.detail


def test_auto_with_defer_is_refused_a_budget_that_only_covers_auto_without_it(tmp_path: Path) -> None:
    """With ``defer`` ``auto`` plans each batch alone (solver/defer.py): the service checks the budget it
    needs then, not the smaller one ``auto`` needs without deferral."""
    from skrull.solver.budget import smallest_budget_s
    from skrull.solver.types import Parallel

    batches = [[50] * 64 for _ in range(64)]
    doc = plan_request(batches, solver="auto")
    parallel = Parallel(dp=doc["parallel"]["dp"], cp=doc["parallel"]["cp"])
    sizes = [len(b) for b in batches]
    plain = smallest_budget_s("auto", sizes, parallel) * 1.1
    assert plain < smallest_budget_s("auto", sizes, parallel, deferring=True)
    with running_app(tmp_path / "skrull.db") as client:
        assert client.post("/v1/plans", json={**doc, "time_budget_s": plain}).status_code == 202
        deferring = {**doc, "time_budget_s": plain, "defer": {"max_sequences": 2}}
        r = client.post("/v1/plans", json=deferring)
        assert r.status_code == 422, r.text
        problem = ProblemModel.model_validate(r.json())
        assert problem.field == "time_budget_s" and "with defer" in problem.detail
        quoted = float(problem.detail.rsplit(">= ", 1)[1])
        assert client.post("/v1/plans", json={**deferring, "time_budget_s": quoted}).status_code == 202


def test_a_defer_with_a_longer_wait_is_taken_and_a_wait_below_one_refused_naming_it(tmp_path: Path) -> None:
    from skrull.api.schemas import PlanEnvelope

    doc = plan_request([[50] * 8, [60] * 8, [70] * 8], solver="auto", time_budget_s=2.0)
    with running_app(tmp_path / "skrull.db") as client:
        bad = client.post("/v1/plans", json={**doc, "defer": {"max_sequences": 2, "max_wait": 0}})
        assert bad.status_code == 422, bad.text
        assert ProblemModel.model_validate(bad.json()).field == "defer.max_wait"
        r = client.post("/v1/plans", json={**doc, "defer": {"max_sequences": 2, "max_wait": 3}})
        assert r.status_code == 202, r.text
        done = client.get(f"/v1/plans/{r.json()['id']}", params={"wait": 30, "until": "final"})
        envelope = PlanEnvelope.model_validate(done.json())
        assert envelope.status == "solved" and envelope.plan is not None
        assert len(envelope.plan.iterations) == 3

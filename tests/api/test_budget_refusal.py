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

"""Hypothesis requests shared by the peer planners' tests: short sequences mixed with ones near the
group's limit, over 1-3 batches, so queues, wide groups and heterogeneous replicas all get exercised."""

from __future__ import annotations

from hypothesis import strategies as st

from skrull.solver.planners.base import Planner
from skrull.solver.planning import assemble_plan
from skrull.solver.types import Plan, Problem, Request
from skrull.solver.validate import plan_problems
from tests.conftest import make_request


@st.composite
def requests(draw: st.DrawFn, *, max_batches: int = 3, max_len: int = 30) -> Request:
    dp = draw(st.integers(1, 4))
    cp = draw(st.integers(1, 6))
    bucket = draw(st.integers(4, 300))
    limit = cp * bucket
    length = st.one_of(
        st.integers(1, max(1, bucket // 2)), st.integers(1, limit), st.integers(max(1, limit - 3), limit)
    )
    batches = draw(st.lists(st.lists(length, min_size=1, max_size=max_len), min_size=1, max_size=max_batches))
    return make_request(batches, dp=dp, cp=cp, bucket=bucket)


def planned(planner: Planner, request: Request) -> Plan:
    """Run one planner instance (not the registry's default) and check the plan like ``solve`` does."""
    problem = Problem.from_request(request)
    plan = assemble_plan(problem, planner.plan(problem), solver=planner.name, wall_ms=0.0)
    assert plan_problems(plan, request) == []
    return plan

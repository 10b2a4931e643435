"""Local search on any layout: keeps every sequence once, fits every bucket, never gets slower."""

from __future__ import annotations

import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skrull.solver.cost import CostModel
from skrull.solver.planners.hydraulis import HydraulisPlanner
from skrull.solver.planners.registry import get_planner
from skrull.solver.planning import assemble_plan
from skrull.solver.search.improve import blocks_by_size, iteration_ms, search_iteration
from skrull.solver.types import Problem, Request
from skrull.solver.validate import plan_problems
from tests.solver.search.strategies import one_batch_requests

STARTS = ["packed", "skrull", "hydraulis", "dynamic-cp", "wlb"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(one_batch_requests(30), st.sampled_from(STARTS), st.integers(0, 3))
def test_search_keeps_plans_valid_and_never_slower(request: Request, start: str, seed: int) -> None:
    problem = Problem.from_request(request)
    planner = HydraulisPlanner(deterministic=True) if start == "hydraulis" else get_planner(start)
    output = planner.plan(problem)
    specs = output.iterations[0]
    cost = CostModel(request.profile, bucket_tokens=request.bucket_tokens)
    gpus = request.parallel.num_gpus
    found = search_iteration(
        [specs], lengths=problem.lengths, cost=cost, num_gpus=gpus, deadline=time.monotonic() + 0.2, seed=seed
    )
    assert iteration_ms(found, problem.lengths, cost, gpus) <= iteration_ms(specs, problem.lengths, cost, gpus) + 1e-9
    improved = type(output)(iterations=(tuple(found),), pending=output.pending)
    plan = assemble_plan(problem, improved, solver="auto", wall_ms=0.0)
    assert plan_problems(plan, request) == []


def test_blocks_are_aligned_and_cover_every_gpu_once_per_size() -> None:
    blocks = blocks_by_size(12)
    assert sorted(blocks) == [1, 2, 3, 4, 6, 12]
    for size, groups in blocks.items():
        assert sorted(g for block in groups for g in block) == list(range(12))
        assert all(block[0] % size == 0 and len(block) == size for block in groups)

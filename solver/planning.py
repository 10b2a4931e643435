"""Run a planner on a request and turn its placements into a validated, estimated plan."""

from __future__ import annotations

import dataclasses
import time

from skrull.solver.cost import CostModel
from skrull.solver.planners.base import PlannerOutput
from skrull.solver.planners.registry import get_planner
from skrull.solver.search.budget import check_budget
from skrull.solver.types import Iteration, Microbatch, Plan, Problem, Request, SolveInfo
from skrull.solver.validate import validate_plan


def assemble_plan(problem: Problem, output: PlannerOutput, *, solver: str, wall_ms: float) -> Plan:
    """Estimate every microbatch and iteration with the reference model and fill the ``solve`` block.

    The plan's objective is the summed iteration time over all iterations; each iteration's lower bound
    is the contract's bound over the sequences that iteration actually runs.
    """
    model = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens)
    lengths = problem.lengths
    iterations = []
    for index, specs in enumerate(output.iterations):
        microbatches = tuple(
            Microbatch(
                step=s.step,
                ranks=s.ranks,
                local=s.local,
                sharded=s.sharded,
                estimated_ms=model.spec_time_ms(s, lengths),
                sharding=s.sharding,
            )
            for s in specs
        )
        iteration_ms = model.iteration_time_ms(
            ((mb.ranks, mb.estimated_ms) for mb in microbatches), problem.parallel.num_gpus
        )
        bound = model.lower_bound_ms([lengths[i] for mb in microbatches for i in mb.seq_ids], problem.parallel)
        iterations.append(
            Iteration(index=index, microbatches=microbatches, estimated_ms=iteration_ms, lower_bound_ms=bound)
        )
    objective = sum(it.estimated_ms for it in iterations)
    bound_ms = output.bound_ms
    gap = None
    if bound_ms is not None:
        gap = (objective - bound_ms) / objective if objective > 0 else 0.0
    return Plan(
        solver=solver,
        parallel=problem.parallel,
        bucket_tokens=problem.bucket_tokens,
        iterations=tuple(iterations),
        pending=output.pending,
        solve=SolveInfo(
            wall_ms=wall_ms,
            status=output.status,
            objective_ms=objective,
            bound_ms=bound_ms,
            gap=gap,
            stats=output.stats,
        ),
    )


def solve(request: Request) -> Plan:
    """Plan ``request`` with its solver; the plan is validated before it is returned.

    ``solve.wall_ms`` covers planning, estimation and validation (everything but reading and writing).
    A budget the solver cannot keep is refused first (``search.budget.check_budget``).
    """
    check_budget(request.solver, [len(b) for b in request.batches], request.time_budget_s)
    start = time.perf_counter()
    problem = Problem.from_request(request)
    planner = get_planner(request.solver)
    output = planner.plan(problem)
    plan = assemble_plan(problem, output, solver=request.solver, wall_ms=0.0)
    validate_plan(plan, request)
    wall_ms = (time.perf_counter() - start) * 1e3
    return dataclasses.replace(plan, solve=dataclasses.replace(plan.solve, wall_ms=wall_ms))

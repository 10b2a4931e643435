"""OR-Tools CP-SAT backend for ``LinearModel``."""

from __future__ import annotations

import time

from ortools.sat.python import cp_model

from skrull.solver.ilp.model import LinearModel
from skrull.solver.ilp.result import STOP_MARGIN_S, BackendResult, IncumbentCallback


class _Incumbents(cp_model.CpSolverSolutionCallback):
    def __init__(self, variables: list[cp_model.IntVar], callback: IncumbentCallback) -> None:
        super().__init__()
        self._variables = variables
        self._callback = callback

    def on_solution_callback(self) -> None:
        values = [int(self.value(v)) for v in self._variables]
        self._callback(values, int(self.objective_value), int(self.best_objective_bound))


def solve_cpsat(
    model: LinearModel,
    *,
    time_limit_s: float,
    deadline: float | None = None,
    seed: int = 0,
    deterministic: bool = False,
    num_workers: int = 2,
    on_incumbent: IncumbentCallback | None = None,
) -> BackendResult:
    """Solve with CP-SAT within ``time_limit_s`` (and before ``deadline``, a ``time.monotonic()`` value,
    counting the model's translation). ``deterministic`` uses one worker and a deterministic time limit instead of
    wall-clock (the same request then gives the same plan on any machine)."""
    cp = cp_model.CpModel()
    variables = [
        cp.new_int_var(lo, hi, name) for name, lo, hi in zip(model.names, model.lower, model.upper, strict=True)
    ]
    for c in model.constraints:
        expr = cp_model.LinearExpr.weighted_sum([variables[v] for v in c.coeffs], list(c.coeffs.values()))
        if c.lower is not None and c.upper is not None and c.lower == c.upper:
            cp.add(expr == c.lower)
        else:
            if c.lower is not None:
                cp.add(expr >= c.lower)
            if c.upper is not None:
                cp.add(expr <= c.upper)
    cp.minimize(
        cp_model.LinearExpr.weighted_sum([variables[v] for v in model.objective], list(model.objective.values()))
    )
    for v, value in model.hint.items():
        cp.add_hint(variables[v], value)

    if deadline is not None:  # the translation above used part of the budget
        time_limit_s = min(time_limit_s, deadline - time.monotonic() - STOP_MARGIN_S)
    solver = cp_model.CpSolver()
    params = solver.parameters
    params.random_seed = seed
    params.log_search_progress = False
    if deterministic:
        params.num_workers = 1
        # About 1 deterministic unit per second on a current core; the wall-clock budget still applies.
        params.max_deterministic_time = max(0.05, time_limit_s)
        params.max_time_in_seconds = max(0.05, time_limit_s * 4)
    else:
        params.num_workers = max(1, num_workers)
        params.max_time_in_seconds = max(0.05, time_limit_s)
    callback = _Incumbents(variables, on_incumbent) if on_incumbent is not None else None
    status = solver.solve(cp, callback)
    if status == cp_model.OPTIMAL:
        name = "optimal"
    elif status == cp_model.FEASIBLE:
        name = "feasible"
    elif status == cp_model.INFEASIBLE:
        return BackendResult(status="infeasible", values=None, objective=None, bound=None)
    else:
        return BackendResult(status="unknown", values=None, objective=None, bound=None)
    values = [int(solver.value(v)) for v in variables]
    return BackendResult(
        status=name, values=values, objective=int(solver.objective_value), bound=int(solver.best_objective_bound)
    )

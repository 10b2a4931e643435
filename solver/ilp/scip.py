"""SCIP backend (pyscipopt) for ``LinearModel``."""

from __future__ import annotations

import math
import time
from typing import Any

import pyscipopt
from pyscipopt.scip import PY_SCIP_EVENTTYPE

from skrull.solver.ilp.model import LinearModel
from skrull.solver.ilp.result import STOP_MARGIN_S, BackendResult, IncumbentCallback


class _Incumbents(pyscipopt.Eventhdlr):
    def __init__(self, variables: list[Any], callback: IncumbentCallback) -> None:
        super().__init__()
        self._variables = variables
        self._callback = callback

    def eventinit(self) -> None:
        self.model.catchEvent(PY_SCIP_EVENTTYPE.BESTSOLFOUND, self)

    def eventexit(self) -> None:
        self.model.dropEvent(PY_SCIP_EVENTTYPE.BESTSOLFOUND, self)

    def eventexec(self, event: Any) -> None:
        sol = self.model.getBestSol()
        values = [round(self.model.getSolVal(sol, v)) for v in self._variables]
        bound = self.model.getDualbound()
        self._callback(values, round(self.model.getSolObjVal(sol)), _floor(bound))


def _floor(bound: float) -> int | None:
    return math.floor(bound + 1e-6) if math.isfinite(bound) else None


def solve_scip(
    model: LinearModel,
    *,
    time_limit_s: float,
    deadline: float | None = None,
    seed: int = 0,
    deterministic: bool = False,
    num_workers: int = 1,
    on_incumbent: IncumbentCallback | None = None,
) -> BackendResult:
    """Solve with SCIP within ``time_limit_s`` and before ``deadline`` (single-threaded; deterministic
    for a given seed up to the wall-clock limit)."""
    scip = pyscipopt.Model()
    scip.hideOutput()
    variables = [
        scip.addVar(name=name, vtype="B" if (lo, hi) == (0, 1) else "I", lb=lo, ub=hi)
        for name, lo, hi in zip(model.names, model.lower, model.upper, strict=True)
    ]
    for c in model.constraints:
        expr = pyscipopt.quicksum(coef * variables[v] for v, coef in c.coeffs.items())
        if c.lower is not None and c.lower == c.upper:
            scip.addCons(expr == c.lower)
            continue
        if c.lower is not None:
            scip.addCons(expr >= c.lower)
        if c.upper is not None:
            scip.addCons(expr <= c.upper)
    scip.setObjective(pyscipopt.quicksum(coef * variables[v] for v, coef in model.objective.items()), "minimize")
    if deadline is not None:  # the translation above used part of the budget
        time_limit_s = min(time_limit_s, deadline - time.monotonic() - STOP_MARGIN_S)
    scip.setParam("limits/time", max(0.05, time_limit_s))
    scip.setParam("randomization/randomseedshift", seed)
    # the objective is an integer: let SCIP use it to prune
    scip.setParam("limits/gap", 0.0)
    if model.hint:
        sol = scip.createSol()
        for v, value in model.hint.items():
            scip.setSolVal(sol, variables[v], value)
        scip.addSol(sol, free=True)
    if on_incumbent is not None:
        scip.includeEventhdlr(_Incumbents(variables, on_incumbent), "incumbents", "streams improving solutions")
    scip.optimize()
    status = scip.getStatus()
    if scip.getNSols() == 0:
        return BackendResult(
            status="infeasible" if status == "infeasible" else "unknown", values=None, objective=None, bound=None
        )
    best = scip.getBestSol()
    values = [round(scip.getSolVal(best, v)) for v in variables]
    return BackendResult(
        status="optimal" if status == "optimal" else "feasible",
        values=values,
        objective=round(scip.getObjVal()),
        bound=_floor(scip.getDualbound()),
    )

"""The min-max packing ILP two peers solve (CP-SAT): items to bins, each bin within a token cap,
minimising the heaviest bin's weight (WLB-LLM eq. 1, Hydraulis stage 2).

    x[k][j] in {0,1}, sum_j x[k][j] = 1,  sum_k size_k x[k][j] <= cap,  load_j = sum_k weight_k x[k][j],
    T >= load_j, load_j >= load_{j+1} (interchangeable bins), minimise T.

A hint (bin per item) is relabelled to respect the symmetry order and given whole (assignment, loads
and objective). One worker and a fixed seed; ``deterministic`` swaps the wall-clock limit for CP-SAT's
deterministic one.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

#: The module ``solve_minmax_pack`` imports, and the seconds a first import takes (CP-SAT pulls in
#: pandas: 0.32-0.45 s measured on the 2-core machine). Callers under a wall-clock budget skip the
#: ILP while the module is cold and less than this is left.
CP_SAT_MODULE = "ortools.sat.python.cp_model"
COLD_IMPORT_S = 0.5


def preload_cp_sat() -> None:
    """Import CP-SAT now, outside any budget (a service's solver process calls this before its first
    job): a process that only ever sees short budgets would otherwise never find the time to import
    it, and ``hydraulis`` and ``auto``'s hydraulis start would never run their ILP there."""
    importlib.import_module(CP_SAT_MODULE)


def import_fits(seconds_left: float) -> bool:
    """Whether CP-SAT is imported already, or its first import fits in ``seconds_left``."""
    return CP_SAT_MODULE in sys.modules or seconds_left >= COLD_IMPORT_S


def solve_minmax_pack(
    weights: Sequence[int],
    sizes: Sequence[int],
    num_bins: int,
    cap: int,
    *,
    hint: Sequence[int] | None,
    time_limit_s: float,
    seed: int = 0,
    deterministic: bool = False,
    relative_gap: float | None = None,
) -> tuple[list[int] | None, str, float | None]:
    """(bin per item or None, CP-SAT status name, proven bound on the heaviest bin)."""
    from ortools.sat.python import cp_model

    n, m = len(weights), num_bins
    total = sum(weights)
    model = cp_model.CpModel()
    x = [[model.new_bool_var(f"x{k}_{j}") for j in range(m)] for k in range(n)]
    top = model.new_int_var(0, total, "T")
    load_vars = []
    for j in range(m):
        model.add(sum(sizes[k] * x[k][j] for k in range(n)) <= cap)
        load = model.new_int_var(0, total, f"load{j}")
        model.add(load == sum(weights[k] * x[k][j] for k in range(n)))
        model.add(top >= load)
        load_vars.append(load)
    for k in range(n):
        model.add_exactly_one(x[k])
    for j in range(m - 1):
        model.add(load_vars[j] >= load_vars[j + 1])
    model.minimize(top)
    if hint is not None:
        loads = [0] * m
        for k, j in enumerate(hint):
            loads[j] += weights[k]
        order = sorted(range(m), key=lambda j: (-loads[j], j))
        rank = {j: pos for pos, j in enumerate(order)}
        for k, j in enumerate(hint):
            for jj in range(m):
                model.add_hint(x[k][jj], rank[j] == jj)
        for pos, j in enumerate(order):
            model.add_hint(load_vars[pos], loads[j])
        model.add_hint(top, max(loads))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = seed
    if relative_gap is not None:
        solver.parameters.relative_gap_limit = relative_gap
    if deterministic:
        solver.parameters.max_deterministic_time = time_limit_s
    else:
        solver.parameters.max_time_in_seconds = time_limit_s
    status = solver.solve(model)
    name = solver.status_name(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, name, None
    where = [next(j for j in range(m) if solver.value(x[k][j])) for k in range(n)]
    return where, name, solver.best_objective_bound

"""Run one request through several planners and tabulate them on the reference cost model."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from solver.errors import SkrullError
from solver.planners.registry import planner_names
from solver.planning import solve
from solver.types import Plan, Request

REFERENCE_SOLVER = "deepspeed"
#: What ``compare`` runs by default: the heuristic, both exact backends, auto, then the baselines.
DEFAULT_SOLVERS: tuple[str, ...] = ("skrull", "ilp(scip)", "ilp(cpsat)", "auto")


def default_solvers() -> list[str]:
    rest = [n for n in planner_names() if n not in ("skrull", "ilp", "auto")]
    return [*DEFAULT_SOLVERS, *rest]


def parse_solver_spec(spec: str) -> tuple[str, str | None]:
    """``"ilp(scip)"`` -> ``("ilp", "scip")``; ``"skrull"`` -> ``("skrull", None)``."""
    if spec.endswith(")") and "(" in spec:
        name, backend = spec[:-1].split("(", 1)
        return name, backend
    return spec, None


@dataclass(frozen=True, slots=True, kw_only=True)
class CompareRow:
    solver: str
    iteration_ms: float | None
    lower_bound_ms: float | None
    ratio_to_bound: float | None
    bound_ms: float | None
    gap: float | None
    speedup: float | None
    planning_ms: float | None
    num_microbatches: int | None
    status: str
    error: str | None = None


def compare(request: Request, solvers: Sequence[str] | None = None) -> tuple[list[CompareRow], dict[str, Plan]]:
    """Plan ``request`` with every solver (default: all registered); speedups are over ``deepspeed``.

    ``iteration_ms`` is the plan's total over all iterations (one per batch).
    """
    names = list(solvers) if solvers is not None else default_solvers()
    plans: dict[str, Plan] = {}
    errors: dict[str, str] = {}
    for name in dict.fromkeys([*names, REFERENCE_SOLVER]):
        solver, backend = parse_solver_spec(name)
        try:
            plans[name] = solve(dataclasses.replace(request, solver=solver, backend=backend or request.backend))
        except SkrullError as exc:
            errors[name] = str(exc)
    reference = plans.get(REFERENCE_SOLVER)
    rows = []
    for name in names:
        plan = plans.get(name)
        if plan is None:
            rows.append(
                CompareRow(
                    solver=name,
                    iteration_ms=None,
                    lower_bound_ms=None,
                    ratio_to_bound=None,
                    bound_ms=None,
                    gap=None,
                    speedup=None,
                    planning_ms=None,
                    num_microbatches=None,
                    status="error",
                    error=errors[name],
                )
            )
            continue
        total = plan.estimated_ms
        bound = plan.lower_bound_ms
        rows.append(
            CompareRow(
                solver=name,
                iteration_ms=total,
                lower_bound_ms=bound,
                ratio_to_bound=total / bound if bound > 0 else None,
                bound_ms=plan.solve.bound_ms,
                gap=plan.solve.gap,
                speedup=reference.estimated_ms / total if reference is not None and total > 0 else None,
                planning_ms=plan.solve.wall_ms,
                num_microbatches=sum(len(it.microbatches) for it in plan.iterations),
                status=plan.solve.status,
            )
        )
    return rows, plans


def format_table(rows: Sequence[CompareRow]) -> str:
    """A fixed-width text table (Markdown-compatible)."""
    header = [
        "solver",
        "iteration ms",
        "x bound",
        "solver bound ms",
        "gap",
        "speedup vs deepspeed",
        "planning ms",
        "microbatches",
        "status",
    ]
    lines = []
    for r in rows:
        if r.error is not None:
            lines.append([r.solver, "-", "-", "-", "-", "-", "-", "-", f"error: {r.error}"])
            continue
        lines.append(
            [
                r.solver,
                f"{r.iteration_ms:.1f}",
                "-" if r.ratio_to_bound is None else f"{r.ratio_to_bound:.3f}",
                "-" if r.bound_ms is None else f"{r.bound_ms:.1f}",
                "-" if r.gap is None else f"{100 * r.gap:.2f}%",
                "-" if r.speedup is None else f"{r.speedup:.2f}x",
                f"{r.planning_ms:.1f}",
                str(r.num_microbatches),
                r.status,
            ]
        )
    widths = [max(len(h), *(len(line[k]) for line in lines)) for k, h in enumerate(header)]

    def fmt(cells: list[str]) -> str:
        return (
            "| "
            + " | ".join(
                c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
            + " |"
        )

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([fmt(header), sep, *(fmt(line) for line in lines)])

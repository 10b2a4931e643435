"""Run one request through several planners and tabulate them on the reference cost model.

Columns (``solver.metrics`` defines the figures): the plan's layout (static CP groups or flexible
groups), iteration ms (summed over iterations), ratio to the specification's lower bound of the work the
plan runs (the plans' ``lower_bound_ms``, valid for every layout), the solve block's bound (valid for every
layout) and gap to it, an exact row's gap to its own model's bound (``model_gap``: over the static layout
for ``ilp``, over its groups for ``ilp-flex``; its status is proven against that one), speedup over
``deepspeed``, WLB-LLM's imbalance degree, the fullest GPU's share of its bucket, sequences left
``pending`` and their mean delay in iterations (WLB-LLM defers outliers), planning ms, microbatch count,
solver status.

The speedup is ``(deepspeed ms / deepspeed work) / (ms / work)``, time per unit of work (``solver.metrics.
work_ms``, additive over the sequences a plan runs): exactly the plain time ratio when both plans run
every sequence, and fair when a planner defers sequences past the request (WLB-LLM's ``pending``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from skrull.solver.budget import compare_budget_s
from skrull.solver.cost import CostModel
from skrull.solver.errors import PlannerBugError, SkrullError
from skrull.solver.metrics import delay_iterations, imbalance_degree, peak_bucket_use, synchronized_makespan_ms, work_ms
from skrull.solver.planners.registry import planner_names
from skrull.solver.planning import solve
from skrull.solver.types import Plan, Request

REFERENCE_SOLVER = "deepspeed"
#: What ``compare`` runs by default: the heuristic, the exact model over both layouts (static DP x CP
#: groups: ``ilp``, each backend; flexible groups: ``ilp-flex``), auto, then the baselines and peers.
#: Each exact row's ``model_gap`` and status are over its own layout, so ``ilp-flex`` against ``auto``
#: compares like with like; every row's ``bound_ms`` holds for every layout.
DEFAULT_SOLVERS: tuple[str, ...] = ("skrull", "ilp(scip)", "ilp(cpsat)", "ilp-flex", "auto")


def default_solvers(request: Request | None = None) -> list[str]:
    """Every registered planner, the exact ones per backend; given a request, only those that can plan one of
    its ``cp_modes`` (``xtuner`` plans Ulysses only: it is compared where the request allows ulysses)."""
    rest = [n for n in planner_names() if n not in ("skrull", "ilp", "ilp-flex", "auto")]
    if request is not None:
        from skrull.solver.planners.registry import get_planner
        from skrull.solver.planning import planner_cp_modes

        rest = [n for n in rest if set(planner_cp_modes(get_planner(n))) & set(request.cp_modes)]
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
    imbalance_degree: float | None = None
    peak_bucket_use: float | None = None
    pending: int | None = None
    avg_delay_iterations: float | None = None
    makespan_ms: float | None = None
    stats: dict[str, float] | None = None
    #: ``static`` when every microbatch runs on one DP rank's CP group (Skrull's layout), else ``flexible``
    layout: str | None = None
    #: an exact planner's bound over the plans its model expresses, and the gap to it (``solve.model_*``)
    model_bound_ms: float | None = None
    model_gap: float | None = None


def compare(request: Request, solvers: Sequence[str] | None = None) -> tuple[list[CompareRow], dict[str, Plan]]:
    """Plan ``request`` with every solver (default: all registered); speedups are over ``deepspeed``.
    A request without ``time_budget_s`` gives each planner ``solver.budget.compare_budget_s``.

    ``iteration_ms`` is the plan's total over all iterations (one per batch).
    """
    names = list(solvers) if solvers is not None else default_solvers(request)
    plans: dict[str, Plan] = {}
    errors: dict[str, str] = {}
    for name in dict.fromkeys([*names, REFERENCE_SOLVER]):
        solver, backend = parse_solver_spec(name)
        try:
            budget_s = request.time_budget_s
            if budget_s is None:  # every planner the same quick default, raised to what it needs
                budget_s = compare_budget_s(solver, [len(b) for b in request.batches], request.parallel)
            planned = dataclasses.replace(
                request, solver=solver, backend=backend or request.backend, time_budget_s=budget_s
            )
            plans[name] = solve(planned)
        except (SkrullError, PlannerBugError) as exc:  # one planner's failure is its row, not the table's
            errors[name] = str(exc)
        except Exception as exc:  # a registered (plugin) planner that raises anything else: its row too
            errors[name] = f"planner {name!r} failed: {type(exc).__name__}: {exc}"
    reference = plans.get(REFERENCE_SOLVER)
    lengths = [s for batch in request.batches for s in batch]
    model = CostModel(request.profile, bucket_tokens=request.bucket_tokens)
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
        bound = plan.lower_bound_ms  # each iteration's, over the sequences it runs: valid for every layout
        stats = plan.solve.stats_dict
        rows.append(
            CompareRow(
                solver=name,
                iteration_ms=total,
                lower_bound_ms=bound,
                ratio_to_bound=total / bound if bound > 0 else None,
                bound_ms=plan.solve.bound_ms,
                gap=plan.solve.gap,
                speedup=_speedup(reference, plan, lengths, model),
                planning_ms=plan.solve.wall_ms,
                num_microbatches=sum(len(it.microbatches) for it in plan.iterations),
                status=plan.solve.status,
                imbalance_degree=imbalance_degree(plan),
                peak_bucket_use=peak_bucket_use(plan, lengths),
                pending=len(plan.pending),
                avg_delay_iterations=(
                    stats["avg_delay_iterations"] if "avg_delay_iterations" in stats else _delay(plan, request, lengths)
                ),
                makespan_ms=synchronized_makespan_ms(plan),
                stats=stats or None,
                layout=layout_of(plan),
                model_bound_ms=plan.solve.model_bound_ms,
                model_gap=plan.solve.model_gap,
            )
        )
    return rows, plans


def _delay(plan: Plan, request: Request, lengths: Sequence[int]) -> float | None:
    """``solver.metrics.delay_iterations`` for a plan that moves work later, None for one that does not."""
    delay = delay_iterations(plan, [len(b) for b in request.batches], lengths)
    return delay if delay > 0 else None


def layout_of(plan: Plan) -> str:
    """``static`` if every microbatch runs on a DP rank's CP group, else ``flexible``."""
    par = plan.parallel
    static = all(mb.ranks == par.cp_group(mb.ranks[0] // par.cp) for it in plan.iterations for mb in it.microbatches)
    return "static" if static else "flexible"


def _speedup(reference: Plan | None, plan: Plan, lengths: list[int], model: CostModel) -> float | None:
    """Reference time per work over this plan's time per work (module docstring)."""
    if reference is None or plan.estimated_ms <= 0 or reference.estimated_ms <= 0:
        return None
    ref_work, own_work = work_ms(reference, lengths, model), work_ms(plan, lengths, model)
    if ref_work <= 0 or own_work <= 0:
        return None
    return (reference.estimated_ms / ref_work) / (plan.estimated_ms / own_work)


def table_columns() -> list[str]:
    """Every figure of a ``CompareRow``, in order: the columns of ``POST /v1/compare``'s table. The CLI's
    text table (``format_table``) formats the same rows, so the service answers every figure it prints."""
    return [f.name for f in dataclasses.fields(CompareRow)]


def table_rows(rows: Sequence[CompareRow]) -> list[list[Any]]:
    """The rows' values in ``table_columns`` order (JSON-ready)."""
    return [[getattr(r, c) for c in table_columns()] for r in rows]


def _opt(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_table(rows: Sequence[CompareRow]) -> str:
    """A fixed-width text table (Markdown-compatible)."""
    header = [
        "solver",
        "layout",
        "iteration ms",
        "x bound (any layout)",
        "bound ms (any layout)",
        "gap (any layout)",
        "gap (own model)",
        "speedup vs deepspeed",
        "imbalance",
        "peak bucket",
        "pending",
        "delay it",
        "planning ms",
        "microbatches",
        "status",
    ]
    lines = []
    for r in rows:
        if r.error is not None:
            lines.append([r.solver, *(["-"] * (len(header) - 2)), f"error: {r.error}"])
            continue
        lines.append(
            [
                r.solver,
                r.layout or "-",
                f"{r.iteration_ms:.1f}",
                _opt(r.ratio_to_bound, ".3f"),
                _opt(r.bound_ms, ".1f"),
                "-" if r.gap is None else f"{100 * r.gap:.2f}%",
                "-" if r.model_gap is None else f"{100 * r.model_gap:.2f}%",
                "-" if r.speedup is None else f"{r.speedup:.2f}x",
                _opt(r.imbalance_degree, ".3f"),
                "-" if r.peak_bucket_use is None else f"{100 * r.peak_bucket_use:.0f}%",
                str(r.pending),
                _opt(r.avg_delay_iterations, ".2f"),
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

"""Run one request through several planners and tabulate them on the reference cost model.

Budgets: a request that names ``time_budget_s`` (or ``--time-budget-s``) gives it to every planner; else
each planner gets what ``skrull plan`` would give it (``Request.resolved_time_budget_s``: 1 s, 60 s for
the exact planners ``ilp`` and ``ilp-flex``, raised to what the request's size needs). An exact planner
stops early once it proves its plan optimal. The heuristics run first; then every exact planner starts
from the best plan of its layout they gave (``ilp``: the cheapest static plan that runs every sequence;
``ilp-flex``: the cheapest plan that runs every sequence, ``auto``'s among them), so it is never worse
than that start.

Bounds: one per meaning, computed once for the request (not per row), each never above any plan of the
layout it claims that runs every sequence of its own batch:

* ``bound_any_layout_ms``: per batch ``search.bound.sharding_floor_ms`` (which includes the
  specification's lower bound), summed; no plan with any groups beats it;
* ``bound_static_ms``: per batch the larger of that and ``CostModel.static_bound_ms``, summed, raised to
  ``ilp``'s proven model bound where it ran; no plan made of whole CP groups (Skrull's layout) beats it.

A row that *defers* (runs a sequence in a later iteration than its batch's, or leaves it ``pending``)
runs other work than the request's batches, so neither bound holds for it: its ratio is to the bound of
the work it runs (``x own-work bound``), in its own column, and it is marked. ``speedup`` is per unit of
work: ``(deepspeed ms / deepspeed work) / (ms / work)`` (``solver.metrics.work_ms``, additive over the
sequences a plan runs), the plain time ratio when both plans run every sequence.

``LEGEND`` explains every column of ``format_table`` (printed under the table, in ``--help`` and in
docs/planners.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from skrull.solver.budget import EXACT_SOLVERS
from skrull.solver.cost import CostModel
from skrull.solver.errors import PlannerBugError, SkrullError
from skrull.solver.metrics import delay_iterations, imbalance_degree, peak_bucket_use, synchronized_makespan_ms, work_ms
from skrull.solver.plan import MicrobatchSpec
from skrull.solver.planners.base import Planner
from skrull.solver.planners.registry import planner_names
from skrull.solver.planning import solve
from skrull.solver.search.bound import sharding_floor_ms
from skrull.solver.types import Plan, Request

REFERENCE_SOLVER = "deepspeed"
#: What ``compare`` runs by default: the heuristic, the exact model over both layouts (static DP x CP
#: groups: ``ilp``, each backend; flexible groups: ``ilp-flex``), auto, then the baselines and peers.
#: Each exact row's ``model_gap`` and status are over its own layout, so ``ilp-flex`` against ``auto``
#: compares like with like.
DEFAULT_SOLVERS: tuple[str, ...] = ("skrull", "ilp(scip)", "ilp(cpsat)", "ilp-flex", "auto")

#: What every column of ``format_table`` means (printed under the table, in ``skrull compare --help``).
LEGEND = """\
Legend (times are estimates of the reference cost model, docs/formats.md):
  layout          static: every microbatch on one DP rank's CP group (Skrull's layout); flexible: other groups
  ms/iteration    the plan's time per iteration (global batch): total ms / iterations
  total ms        summed over the request's iterations
  x bound         total ms / the any-layout bound (above the table): no plan goes below 1.000
  x own-work      deferring rows (marked *) only: total ms / the any-layout bound of the work the row runs
  gap to layout   (total ms - the bound of the row's layout) / total ms: static rows against the static bound
  model gap       exact planners: the gap to their own model's proven bound (status is proven against it)
  speedup         deepspeed's time per unit of work / this row's (per unit of work: fair to deferring rows)
  imbalance       WLB-LLM's imbalance degree: slowest GPU / mean GPU, averaged over iterations
  peak bucket     the fullest GPU's share of its memory bucket
  pending         sequences left for a later request (deferred); delay it: their mean delay in iterations
  budget s        the planner's time budget; planning ms: what it used (an exact planner stops once optimal)
  *               the row defers sequences: it runs other work than the request's batches, so the bounds do
                  not hold for it and it is compared per unit of work only
"""


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


#: The fields of a row without a default that only a plan gives: None on the row of a planner that failed.
NO_PLAN: dict[str, None] = dict.fromkeys(
    ("iteration_ms", "lower_bound_ms", "ratio_to_bound", "gap", "speedup", "planning_ms", "num_microbatches")
)


@dataclass(frozen=True, slots=True, kw_only=True)
class CompareRow:
    """One planner's line of the table. A planner that failed has ``status: error``, ``error`` and the
    request's bounds; every figure of a plan is None on it (``NO_PLAN``, and the defaults)."""

    solver: str
    #: the plan's total over all iterations (the name is kept for the service's clients: ``total_ms`` too)
    iteration_ms: float | None
    #: the any-layout bound of the work this row runs (per iteration, summed): the request's for a row that
    #: runs every batch whole
    lower_bound_ms: float | None
    #: ``iteration_ms / bound_ms`` for a row that does not defer, else None (``ratio_to_own_work_bound``)
    ratio_to_bound: float | None
    #: the request's any-layout bound (``bound_any_layout_ms``), the same on every row
    bound_ms: float | None
    #: ``(iteration_ms - bound_ms) / iteration_ms`` for a row that does not defer
    gap: float | None
    #: time per unit of work, deepspeed's over this row's
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
    #: the plan's total over all iterations, and per iteration (total / iterations)
    total_ms: float | None = None
    ms_per_iteration: float | None = None
    #: whether the row runs a sequence later than its batch or leaves it pending (the bounds do not hold)
    defers: bool | None = None
    #: a deferring row's total over the any-layout bound of the work it runs
    ratio_to_own_work_bound: float | None = None
    #: the request's bound for plans of this row's layout, and the gap to it (rows that do not defer)
    layout_bound_ms: float | None = None
    layout_gap: float | None = None
    #: the time budget the planner was given
    time_budget_s: float | None = None
    #: the request's static-layout bound (``bound_static_ms``), the same on every row
    bound_static_ms: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Bounds:
    """The request's bounds, one per meaning (module docstring), totals over its batches."""

    any_layout_ms: float
    static_ms: float

    def of_layout(self, layout: str | None) -> float:
        return self.static_ms if layout == "static" else self.any_layout_ms


def request_bounds(request: Request, plans: dict[str, Plan] | None = None) -> Bounds:
    """``bound_any_layout_ms`` and ``bound_static_ms`` of the request (module docstring); ``plans``: an
    ``ilp`` plan's proven model bound raises the static one, and a plan's own any-layout ``bound_ms`` (which
    the planner proved for every layout) raises the any-layout one where it runs every sequence."""
    cost = CostModel(request.profile, bucket_tokens=request.bucket_tokens, cp_modes=request.cp_modes)
    par = request.parallel
    any_layout, static = 0.0, 0.0
    for batch in request.batches:
        floor = sharding_floor_ms(batch, cost, par)
        any_layout += floor
        static += max(floor, cost.static_bound_ms(batch, par))
    for name, plan in (plans or {}).items():
        if _defers(plan, request):
            continue
        if plan.solve.bound_ms is not None:
            any_layout = max(any_layout, plan.solve.bound_ms)
        if parse_solver_spec(name)[0] == "ilp" and plan.solve.model_bound_ms is not None:
            static = max(static, plan.solve.model_bound_ms)
    return Bounds(any_layout_ms=any_layout, static_ms=max(static, any_layout))


def _budget_s(request: Request, solver: str) -> float:
    """What ``skrull plan`` gives ``solver`` for this request (module docstring)."""
    return dataclasses.replace(request, solver=solver).resolved_time_budget_s


def _starts(plans: dict[str, Plan], request: Request, *, static_only: bool) -> list[list[list[MicrobatchSpec]]]:
    """The heuristic plans that run every sequence in its batch, as placements (the exact planners' starts)."""
    out = []
    for name, plan in plans.items():
        if parse_solver_spec(name)[0] in EXACT_SOLVERS or _defers(plan, request):
            continue
        if static_only and layout_of(plan) != "static":
            continue
        out.append(
            [
                [
                    MicrobatchSpec(
                        step=mb.step,
                        ranks=mb.ranks,
                        local=mb.local,
                        sharded=mb.sharded,
                        sharding=mb.sharding,
                        mode=mb.mode,
                    )
                    for mb in it.microbatches
                ]
                for it in plan.iterations
            ]
        )
    return out


def _exact_planner(solver: str, backend: str | None, starts: list[list[list[MicrobatchSpec]]]) -> Planner:
    from skrull.solver.planners.exact import IlpPlanner
    from skrull.solver.planners.exact_flexible import FlexibleIlpPlanner

    if solver == "ilp":
        return IlpPlanner(backend, starts=starts)
    return FlexibleIlpPlanner(backend, starts=starts)


def compare(request: Request, solvers: Sequence[str] | None = None) -> tuple[list[CompareRow], dict[str, Plan]]:
    """Plan ``request`` with every solver (default: all registered), the heuristics first, then the exact
    planners from their best start (module docstring); speedups are over ``deepspeed``."""
    names = list(solvers) if solvers is not None else default_solvers(request)
    order = list(dict.fromkeys([*names, REFERENCE_SOLVER]))
    order.sort(key=lambda n: parse_solver_spec(n)[0] in EXACT_SOLVERS)  # stable: heuristics first
    plans: dict[str, Plan] = {}
    errors: dict[str, str] = {}
    budgets: dict[str, float] = {}
    for name in order:
        solver, backend = parse_solver_spec(name)
        try:
            budgets[name] = _budget_s(request, solver)
            planned = dataclasses.replace(
                request, solver=solver, backend=backend or request.backend, time_budget_s=budgets[name]
            )
            planner = None
            if solver in EXACT_SOLVERS:
                starts = _starts(plans, request, static_only=solver == "ilp")
                planner = _exact_planner(solver, backend, starts)
            plans[name] = solve(planned, planner=planner)
        except (SkrullError, PlannerBugError) as exc:  # one planner's failure is its row, not the table's
            errors[name] = str(exc)
        except Exception as exc:  # a registered (plugin) planner that raises anything else: its row too
            errors[name] = f"planner {name!r} failed: {type(exc).__name__}: {exc}"
    reference = plans.get(REFERENCE_SOLVER)
    lengths = [s for batch in request.batches for s in batch]
    model = CostModel(request.profile, bucket_tokens=request.bucket_tokens)
    bounds = request_bounds(request, plans)
    rows = []
    for name in names:
        plan = plans.get(name)
        if plan is None:
            # the planner failed: its row says why and carries the request's bounds, no figures of a plan
            failed = CompareRow(
                solver=name, status="error", error=errors[name], bound_ms=bounds.any_layout_ms, **NO_PLAN
            )
            rows.append(dataclasses.replace(failed, time_budget_s=budgets.get(name), bound_static_ms=bounds.static_ms))
            continue
        rows.append(_row(name, plan, request, bounds, reference, lengths, model, budgets.get(name)))
    return rows, plans


def _row(
    name: str,
    plan: Plan,
    request: Request,
    bounds: Bounds,
    reference: Plan | None,
    lengths: list[int],
    model: CostModel,
    budget_s: float | None,
) -> CompareRow:
    total = plan.estimated_ms
    defers = _defers(plan, request)
    layout = layout_of(plan)
    own_bound = plan.lower_bound_ms  # each iteration's, over the sequences it runs: valid for every layout
    layout_bound = bounds.of_layout(layout)
    stats = plan.solve.stats_dict
    return CompareRow(
        solver=name,
        iteration_ms=total,
        lower_bound_ms=own_bound,
        ratio_to_bound=None if defers or bounds.any_layout_ms <= 0 else total / bounds.any_layout_ms,
        bound_ms=bounds.any_layout_ms,
        gap=None if defers else _gap(total, bounds.any_layout_ms),
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
        layout=layout,
        model_bound_ms=plan.solve.model_bound_ms,
        model_gap=plan.solve.model_gap,
        total_ms=total,
        ms_per_iteration=total / len(plan.iterations) if plan.iterations else None,
        defers=defers,
        ratio_to_own_work_bound=(total / own_bound if defers and own_bound > 0 else None),
        layout_bound_ms=None if defers else layout_bound,
        layout_gap=None if defers else _gap(total, layout_bound),
        time_budget_s=budget_s,
        bound_static_ms=bounds.static_ms,
    )


def _gap(total: float, bound: float) -> float:
    return (total - bound) / total if total > 0 else 0.0


def _defers(plan: Plan, request: Request) -> bool:
    """Whether the plan leaves a sequence pending or runs one in another iteration than its batch's."""
    if plan.pending or len(plan.iterations) != len(request.batches):
        return True
    start = 0
    for it, batch in zip(plan.iterations, request.batches, strict=True):
        ran = sorted(i for mb in it.microbatches for i in mb.seq_ids)
        if ran != list(range(start, start + len(batch))):
            return True
        start += len(batch)
    return False


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


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def bounds_line(rows: Sequence[CompareRow], num_iterations: int) -> str:
    """The request's two bounds, as printed above the table."""
    if not rows or rows[0].bound_ms is None or rows[0].bound_static_ms is None:
        return ""
    iterations = f"{num_iterations} iteration{'' if num_iterations == 1 else 's'}"
    return (
        f"bounds, totals over {iterations}: no plan beats {rows[0].bound_ms:.1f} ms (any layout); "
        f"none with static CP groups beats {rows[0].bound_static_ms:.1f} ms (static layout)"
    )


def format_table(rows: Sequence[CompareRow]) -> str:
    """A fixed-width text table (Markdown-compatible); ``LEGEND`` says what each column means."""
    header = [
        "solver",
        "layout",
        "ms/iteration",
        "total ms",
        "x bound",
        "x own-work",
        "gap to layout",
        "model gap",
        "speedup (per work)",
        "imbalance",
        "peak bucket",
        "pending",
        "delay it",
        "budget s",
        "planning ms",
        "microbatches",
        "status",
    ]
    lines = []
    for r in rows:
        if r.error is not None:
            lines.append([r.solver, *(["-"] * (len(header) - 2)), f"error: {r.error}"])
            continue
        assert r.iteration_ms is not None
        lines.append(
            [
                f"{r.solver} *" if r.defers else r.solver,
                r.layout or "-",
                _opt(r.ms_per_iteration, ".1f"),
                f"{r.iteration_ms:.1f}",
                _opt(r.ratio_to_bound, ".3f"),
                _opt(r.ratio_to_own_work_bound, ".3f"),
                _pct(r.layout_gap),
                _pct(r.model_gap),
                "-" if r.speedup is None else f"{r.speedup:.2f}x",
                _opt(r.imbalance_degree, ".3f"),
                "-" if r.peak_bucket_use is None else f"{100 * r.peak_bucket_use:.0f}%",
                str(r.pending),
                _opt(r.avg_delay_iterations, ".2f"),
                _opt(r.time_budget_s, "g"),
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

"""Run a planner on a request and turn its placements into a validated, estimated plan.

This is the one place a plan is assembled: ``assemble_plan`` from a planner's output for the whole
request, ``combine_iterations`` from iterations solved one batch at a time (the service streams those,
``solve_batch``); both price with the reference model and fill the ``solve`` block with ``make_plan``.
A plan that fails the independent validator is a ``PlannerBugError``: the planner's fault, not the
request's.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

from skrull.solver.budget import batch_share_s, check_budget
from skrull.solver.cost import CostModel
from skrull.solver.cp_modes import CP_MODES, DEFAULT_CP_MODES, ULYSSES
from skrull.solver.defer import plan_with_deferral
from skrull.solver.equalize import equalize_microbatches
from skrull.solver.errors import InvalidPlanError, PlannerBugError, RequestError
from skrull.solver.gathered import fit_gathered_kv
from skrull.solver.io import MAX_DEFER, check_cp_modes_profile, defer_refusal
from skrull.solver.planners.base import Planner, PlannerOutput
from skrull.solver.planners.registry import get_planner
from skrull.solver.types import Iteration, MicrobatchSpec, Parallel, Plan, Problem, Request, SolveInfo
from skrull.solver.validate import validate_plan


def make_plan(
    *,
    solver: str,
    parallel: Parallel,
    bucket_tokens: int,
    iterations: Sequence[Iteration],
    pending: Sequence[int],
    wall_ms: float,
    status: str,
    bound_ms: float | None,
    model_bound_ms: float | None = None,
    stats: tuple[tuple[str, float], ...] = (),
) -> Plan:
    """The plan with its ``solve`` block: ``objective_ms`` = summed iteration estimates and, when a
    bound is known, ``gap = (objective - bound) / objective`` (0 for an empty objective); the same for
    an exact planner's ``model_bound_ms`` and ``model_gap``."""
    objective = sum(it.estimated_ms for it in iterations)

    def gap_to(bound: float | None) -> float | None:
        if bound is None:
            return None
        return (objective - bound) / objective if objective > 0 else 0.0

    return Plan(
        solver=solver,
        parallel=parallel,
        bucket_tokens=bucket_tokens,
        iterations=tuple(iterations),
        pending=tuple(pending),
        solve=SolveInfo(
            wall_ms=wall_ms,
            status=status,
            objective_ms=objective,
            bound_ms=bound_ms,
            gap=gap_to(bound_ms),
            model_bound_ms=model_bound_ms,
            model_gap=gap_to(model_bound_ms),
            stats=stats,
        ),
    )


def assemble_plan(
    problem: Problem, output: PlannerOutput, *, solver: str, wall_ms: float, cp_modes: tuple[str, ...] | None = None
) -> Plan:
    """Estimate every microbatch and iteration with the reference model and fill the ``solve`` block.

    ``cp_modes``: the modes the request allows (default the problem's), which every iteration's
    ``lower_bound_ms`` covers: a planner that plans all-gather only still reports the bound of the request,
    which another planner's Ulysses microbatches may approach."""
    modes = problem.cp_modes if cp_modes is None else cp_modes
    model = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens, cp_modes=modes)
    iterations = [
        model.price_iteration(specs, problem.lengths, parallel=problem.parallel, index=index)
        for index, specs in enumerate(output.iterations)
    ]
    return make_plan(
        solver=solver,
        parallel=problem.parallel,
        bucket_tokens=problem.bucket_tokens,
        iterations=iterations,
        pending=output.pending,
        wall_ms=wall_ms,
        status=output.status,
        bound_ms=output.bound_ms,
        model_bound_ms=output.model_bound_ms,
        stats=output.stats,
    )


def equalized(output: PlannerOutput, problem: Problem) -> PlannerOutput:
    """The planner's output with equal, aligned microbatch counts (solver/equalize.py): every planner
    honours ``equal_microbatches`` the same way. A proof of optimality was for the unconstrained problem:
    it still holds when the padding costs nothing (the constrained optimum is never below the unconstrained
    one) and is dropped to "feasible" when it costs time; the bound stays valid either way. Only an
    "optimal" output is priced twice to tell, as the plan will run: each microbatch in its cheapest allowed
    mode (``with_modes`` assigns the modes after this; padding can lift a GPU that is the slowest only once
    Ulysses prices apply)."""
    iterations = tuple(tuple(equalize_microbatches(it, problem.parallel)) for it in output.iterations)
    status = output.status
    if status == "optimal":
        model = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens, choose_modes=problem.cp_modes)
        num_gpus = problem.parallel.num_gpus

        def total_ms(its: tuple[tuple[MicrobatchSpec, ...], ...]) -> float:
            return sum(model.iteration_ms(it, problem.lengths, num_gpus) for it in its)

        if total_ms(iterations) > total_ms(output.iterations) + 1e-9:
            status = "feasible"
    return dataclasses.replace(output, iterations=iterations, status=status)


def check_defer(request: Request) -> None:
    """A ``Request`` built in Python, not read by ``solver.io``, gets the reader's refusal of ``defer`` for
    a planner that cannot honour it, and of a ``carried`` count past the first batch."""
    defer = request.defer
    assert defer is not None
    if (reason := defer_refusal(request.solver, defer.max_sequences)) is not None:
        doc = {"max_sequences": defer.max_sequences, "carried": defer.carried, "max_wait": defer.max_wait}
        raise RequestError("defer", doc, reason)
    if not 0 <= defer.max_sequences <= MAX_DEFER:
        raise RequestError("defer.max_sequences", defer.max_sequences, f"must be an integer in 0..{MAX_DEFER}")
    if not 1 <= defer.max_wait <= MAX_DEFER:
        raise RequestError("defer.max_wait", defer.max_wait, f"must be an integer in 1..{MAX_DEFER} (iterations)")
    if not 0 <= defer.carried <= len(request.batches[0]):
        raise RequestError("defer.carried", defer.carried, f"must be in 0..{len(request.batches[0])} (the first batch)")


def planner_cp_modes(planner: Planner) -> tuple[str, ...]:
    """The modes a planner plans (its ``cp_modes`` attribute; a planner that declares none plans all-gather
    CP only, as every planner did before ``ulysses``)."""
    return tuple(getattr(planner, "cp_modes", DEFAULT_CP_MODES))


def check_cp_modes(request: Request, planner: Planner) -> tuple[str, ...]:
    """The modes this planner may use for this request: the request's ``cp_modes`` it can plan. Refused,
    naming ``cp_modes``, when there are none, or when ``ulysses`` alone is allowed and the CP group does not
    divide the attention heads; refused naming the profile's missing section when ulysses is allowed and the
    profile cannot price it."""
    check_cp_modes_profile(request.cp_modes, request.profile)
    usable = tuple(m for m in CP_MODES if m in request.cp_modes and m in planner_cp_modes(planner))
    if not usable:
        raise RequestError(
            "cp_modes",
            list(request.cp_modes),
            f"solver {request.solver!r} plans {', '.join(planner_cp_modes(planner))} only",
        )
    if usable == (ULYSSES,):
        heads = request.profile.heads
        assert heads is not None  # check_cp_modes_profile
        if heads.attention % request.parallel.cp and request.cp_modes == (ULYSSES,):
            raise RequestError(
                "cp_modes",
                list(request.cp_modes),
                f"ulysses alone needs parallel.cp = {request.parallel.cp} to divide heads.attention = "
                f"{heads.attention}; allow allgather too, or choose a cp that divides it",
            )
        if heads.attention % request.parallel.cp:  # the request allows all-gather; this planner does not
            raise RequestError(
                "parallel.cp",
                request.parallel.cp,
                f"solver {request.solver!r} plans ulysses only, which needs the CP group to divide "
                f"heads.attention = {heads.attention}; choose such a cp, or another solver",
            )
    return usable


def with_modes(output: PlannerOutput, problem: Problem, modes: tuple[str, ...]) -> PlannerOutput:
    """Every microbatch that shards over two or more GPUs gets the cheapest of ``modes`` its group can run
    (``CostModel.cheapest_mode``): the per-microbatch choice between all-gather CP and Ulysses.

    The planners that choose modes priced every microbatch so already (``CostModel(choose_modes=...)``: the
    search of ``auto`` and ``skrull``, the exact models' mode decision), so their times, bounds and
    ``optimal`` hold for the plan as assigned here. A microbatch no allowed mode fits (a group that does not
    divide the heads under ``ulysses`` alone; the planners that pick groups keep to those that do,
    ``CostModel.shards_on``) would be a planner's bug: it is refused naming ``cp_modes``."""
    if modes == DEFAULT_CP_MODES:
        return output
    model = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens, cp_modes=problem.cp_modes)
    iterations = []
    for specs in output.iterations:
        out = []
        for spec in specs:
            mode = model.cheapest_mode(spec, problem.lengths, modes)
            if spec.sharded and len(spec.ranks) > 1 and mode not in modes:
                raise RequestError(
                    "cp_modes",
                    list(modes),
                    f"the plan shards over a group of {len(spec.ranks)} GPUs, where no allowed mode runs "
                    "(ulysses needs the group size to divide heads.attention); allow allgather too",
                )
            out.append(spec if mode == spec.mode else dataclasses.replace(spec, mode=mode))
        iterations.append(tuple(out))
    return dataclasses.replace(output, iterations=tuple(iterations))


def check_plan(plan: Plan, request: Request) -> None:
    """Validate a plan the project's planner made: a violation is a ``PlannerBugError``."""
    try:
        validate_plan(plan, request)
    except InvalidPlanError as exc:
        raise PlannerBugError(plan.solver, exc.problems) from None


def check_request(request: Request) -> tuple[str, ...]:
    """Everything ``solve`` refuses before planning: the budget, the modes for this solver, ``defer``. Returns
    the modes the solver may use. ``skrull request`` runs it too, so it never writes a request ``skrull plan``
    refuses."""
    sizes = [len(b) for b in request.batches]
    check_budget(request.solver, sizes, request.resolved_time_budget_s, request.parallel, deferring=request.deferring)
    modes = check_cp_modes(request, get_planner(request.solver))
    if request.defer is not None:
        check_defer(request)
    return modes


def solve(request: Request, *, planner: Planner | None = None) -> Plan:
    """Plan ``request`` with its solver; the plan is validated before it is returned.

    ``planner``: an instance of the request's solver to use instead of the registry's fresh one (``compare``
    passes the exact planners their warm starts this way).

    ``solve.wall_ms`` covers planning, estimation and validation (everything but reading and writing).
    A budget the solver cannot keep is refused first (``solver.budget.check_budget``).
    """
    modes = check_request(request)
    start = time.perf_counter()
    problem = dataclasses.replace(Problem.from_request(request), cp_modes=modes)
    if planner is None:
        planner = get_planner(request.solver)
    if request.defer is not None and request.deferring:  # only auto (solver.io.DEFER_SOLVERS): solver/defer.py
        output = plan_with_deferral(problem, request.defer, backend=request.backend)
    else:
        output = planner.plan(problem)
    output = fit_gathered_kv(output, problem, modes)  # the gathered K/V's memory, whatever the planner checked
    if request.equal_microbatches:
        output = equalized(output, problem)
    if len(planner_cp_modes(planner)) > 1:  # planners that choose: the cheapest allowed mode per microbatch
        output = with_modes(output, problem, modes)
    plan = assemble_plan(problem, output, solver=request.solver, wall_ms=0.0, cp_modes=request.cp_modes)
    check_plan(plan, request)
    wall_ms = (time.perf_counter() - start) * 1e3
    return dataclasses.replace(plan, solve=dataclasses.replace(plan.solve, wall_ms=wall_ms))


# -- one batch at a time -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class IterationResult:
    """One iteration solved on its own: the iteration (global sequence ids, its own index) and its part
    of the plan's ``solve`` block."""

    iteration: Iteration
    wall_ms: float
    status: str
    bound_ms: float | None = None
    pending: tuple[int, ...] = ()


def streams_iterations(solver: str) -> bool:
    """Whether ``solver`` plans every batch from that batch alone (``Planner.streams_iterations``), so
    a multi-batch request may be solved, and published, one batch at a time with the same meaning."""
    return bool(get_planner(solver).streams_iterations)


def shift_iteration(iteration: Iteration, *, offset: int, index: int) -> Iteration:
    """A one-batch plan's iteration renumbered to global sequence ids (``id + offset``) and ``index``."""
    return dataclasses.replace(
        iteration,
        index=index,
        microbatches=tuple(
            dataclasses.replace(
                mb,
                local=tuple(tuple(i + offset for i in ids) for ids in mb.local),
                sharded=tuple(i + offset for i in mb.sharded),
            )
            for mb in iteration.microbatches
        ),
    )


def solve_batch(request: Request, index: int) -> IterationResult:
    """Batch ``index`` of ``request`` planned alone, with its share of the budget (``solver.budget.batch_share_s``:
    in proportion to what each batch needs, so the budget accepted for the whole request is enough for every
    batch), as iteration ``index`` in the request's global sequence ids (validated on its own)."""
    offset = sum(len(b) for b in request.batches[:index])
    share_s = batch_share_s(
        request.solver,
        [len(b) for b in request.batches],
        index,
        request.resolved_time_budget_s,
        request.parallel,
    )
    defer = request.defer
    if defer is not None and index > 0:  # ``carried`` counts the head of batch 0 only
        defer = dataclasses.replace(defer, carried=0)
    sub = dataclasses.replace(request, batches=(request.batches[index],), time_budget_s=share_s, defer=defer)
    plan = solve(sub)
    return IterationResult(
        iteration=shift_iteration(plan.iterations[0], offset=offset, index=index),
        wall_ms=plan.solve.wall_ms,
        status=plan.solve.status,
        bound_ms=plan.solve.bound_ms,
        pending=tuple(i + offset for i in plan.pending),
    )


def combined_status(statuses: Sequence[str], *, bound_known: bool) -> str:
    """The status of a plan made of separately solved iterations: ``timeout`` if any timed out,
    ``optimal`` if all are, ``feasible`` when a bound is known, else ``heuristic``."""
    if "timeout" in statuses:
        return "timeout"
    if statuses and all(s == "optimal" for s in statuses):
        return "optimal"
    return "feasible" if bound_known else "heuristic"


def combine_iterations(request: Request, results: Sequence[IterationResult]) -> Plan:
    """The whole plan from iterations solved one batch at a time, validated against the whole request.

    ``wall_ms`` = the iterations' solve times plus this assembly and validation;
    ``bound_ms`` = the summed bounds when every iteration has one; ``pending`` = the union of the
    iterations' deferred ids. Per-planner ``stats`` are not additive and are not carried.
    """
    start = time.perf_counter()
    ordered = sorted(results, key=lambda r: r.iteration.index)
    bounds = [r.bound_ms for r in ordered]
    bound = sum(b for b in bounds if b is not None) if all(b is not None for b in bounds) else None
    plan = make_plan(
        solver=request.solver,
        parallel=request.parallel,
        bucket_tokens=request.bucket_tokens,
        iterations=[r.iteration for r in ordered],
        pending=sorted(i for r in ordered for i in r.pending),
        wall_ms=0.0,
        status=combined_status([r.status for r in ordered], bound_known=bound is not None),
        bound_ms=bound,
    )
    check_plan(plan, request)
    wall_ms = sum(r.wall_ms for r in ordered) + (time.perf_counter() - start) * 1e3
    return dataclasses.replace(plan, solve=dataclasses.replace(plan.solve, wall_ms=wall_ms))

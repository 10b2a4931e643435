"""The ``ilp`` planner: the exact joint model (solver/ilp) within the request's budget.

Warm-started from the ``skrull`` heuristic, or from the best of the static-layout plans it is given
(``starts``: ``compare`` passes every heuristic's static plan of the request), so never worse than its
start; solved with SCIP or CP-SAT
(``backend``), exactly when the model fits ``EXACT_MAX_BINARIES``, else by LNS. ``auto``
(``planners.auto``) uses ``optimize_iteration`` to refine static plans when its budget allows.

The budget ``time_budget_s`` covers the whole request: each iteration gets an equal share of what is
left, and its solve runs in a child process killed at its deadline (``solver.ilp.runner``). Two bounds
are reported: ``bound_ms``, valid for every layout (``search.bound.sharding_floor_ms`` of each iteration),
and ``model_bound_ms``, valid for the static layout only: the larger of the static bounds, the solver's
dual bound (valid: the model floors every time coefficient) and ``bound_ms`` itself (every layout includes
the static one), so ``model_bound_ms >= bound_ms`` always; ``gap = (objective - bound) / objective``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from skrull.solver.cost import CostModel
from skrull.solver.cp_modes import CP_MODES
from skrull.solver.ilp.backends import require_backend
from skrull.solver.ilp.builder import GroupMicrobatch, Layout
from skrull.solver.ilp.runner import Report, Work, run_with_deadline
from skrull.solver.ilp.search import EXACT_MAX_BINARIES, improve_lns, model_size, plan_time_ms, solve_exact
from skrull.solver.plan import MicrobatchSpec, Parallel, Problem
from skrull.solver.planners.base import OPTIMAL_TOLERANCE, Cost, PlannerOutput, make_spec
from skrull.solver.planners.dacp import dacp_place
from skrull.solver.planners.skrull import gds_dacp_batch
from skrull.solver.search.bound import layout_free_bound_ms, sharding_floor_ms
from skrull.solver.search.budget import FINISH_RESERVE_PER_SEQUENCE_S

Groups = list[list[GroupMicrobatch]]
#: Plans to start from: each a plan's iterations, each iteration its microbatches (global sequence ids).
Starts = Sequence[Sequence[Sequence[MicrobatchSpec]]]
DEFAULT_BACKEND = "cpsat"


@dataclass(frozen=True, slots=True, kw_only=True)
class IterationResult:
    groups: Groups
    bound_ms: float
    status: str


def specs_to_groups(specs: Sequence[MicrobatchSpec], parallel: Parallel) -> Groups:
    """Static-layout microbatches per DP rank, in step order."""
    groups: Groups = [[] for _ in range(parallel.dp)]
    for spec in sorted(specs, key=lambda s: s.step):
        assert spec.ranks == parallel.cp_group(spec.ranks[0] // parallel.cp), "static layout expected"
        groups[spec.ranks[0] // parallel.cp].append((spec.local, spec.sharded))
    return groups


def is_static(specs: Sequence[MicrobatchSpec], parallel: Parallel) -> bool:
    """Whether every microbatch runs on one DP rank's CP group (Skrull's layout)."""
    return all(s.ranks == parallel.cp_group(s.ranks[0] // parallel.cp) for s in specs if s.ranks)


def groups_to_specs(groups: Groups, parallel: Parallel) -> list[MicrobatchSpec]:
    return [
        make_spec(step=step, ranks=parallel.cp_group(g), local=local, sharded=sharded)
        for g, group in enumerate(groups)
        for step, (local, sharded) in enumerate(group)
    ]


def exact_work(
    problem: Problem,
    ids: tuple[int, ...],
    hint: Groups,
    *,
    group_size: int,
    cost: CostModel,
    lower_bound_ms: float,
    backend: str,
    layout: Layout | None = None,
) -> Work:
    """The exact solve of one iteration (static, or over ``layout``) as work for ``run_with_deadline``."""

    def work(report: Report, deadline: float) -> dict[str, Any]:
        return solve_exact(
            seq_ids=ids,
            lengths=problem.lengths,
            group_size=group_size,
            cost=cost,
            hint=hint,
            lower_bound_ms=lower_bound_ms,
            backend=backend,
            deadline=deadline,
            seed=problem.seed,
            deterministic=problem.deterministic,
            report=report,
            layout=layout,
        )

    return work


def optimize_iteration(
    problem: Problem, ids: tuple[int, ...], hint: Groups, *, backend: str, deadline: float, grace_s: float
) -> IterationResult:
    """Improve ``hint`` for one batch until ``deadline`` (monotonic); never returns a worse plan.

    Priced as the plan runs, each microbatch in its cheapest allowed mode (``CostModel(choose_modes=...)``):
    the model makes that mode a decision (solver/ilp/builder.py), so its bound and "optimal" hold for plans
    whose modes ``planning.with_modes`` assigns after it, and the lower bounds cover every allowed mode."""
    cost = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens, choose_modes=problem.cp_modes)
    lengths = problem.lengths
    n = problem.parallel.cp
    # the static bound and the layout-free one (search/bound.py) both hold for every static plan; the
    # layout-free one counts whole microbatches, so it is the tighter where fixed costs dominate
    batch = [lengths[i] for i in ids]
    lower = max(cost.static_bound_ms(batch, problem.parallel), layout_free_bound_ms(batch, cost, problem.parallel))
    links = static_links(cost, problem.parallel)  # each DP rank's CP group on the link its ranks use
    layout = Layout.static(problem.parallel.dp, n, links)
    if deadline - time.monotonic() < MIN_SOLVE_S:  # no time to fork a solver and build its model: the hint
        return IterationResult(
            groups=hint, bound_ms=min(lower, plan_time_ms(hint, lengths, cost, links)), status="timeout"
        )
    if (
        model_size(seq_ids=ids, lengths=lengths, group_size=n, cost=cost, hint=hint, layout=layout)
        <= EXACT_MAX_BINARIES
    ):
        work = exact_work(
            problem, ids, hint, group_size=n, cost=cost, lower_bound_ms=lower, backend=backend, layout=layout
        )
    else:

        def work(report: Report, dl: float) -> dict[str, Any]:
            return improve_lns(
                groups=hint,
                lengths=lengths,
                group_size=n,
                cost=cost,
                backend=backend,
                deadline=dl,
                seed=problem.seed,
                report=report,
                links=links,
            )

    outcome = run_with_deadline(work, deadline=deadline, grace_s=grace_s)
    payload = outcome.payload or {}
    groups: Groups = payload.get("groups") or hint
    if plan_time_ms(groups, lengths, cost, links) > plan_time_ms(hint, lengths, cost, links):
        groups = hint
    bound = max(lower, payload.get("bound_ms") or 0.0)
    objective = plan_time_ms(groups, lengths, cost, links)
    bound = min(bound, objective)
    if outcome.killed:
        status = "timeout"
    elif payload.get("status") == "optimal" and objective - bound <= OPTIMAL_TOLERANCE * max(objective, 1e-9):
        status = "optimal"
    else:
        status = "feasible"
    return IterationResult(groups=groups, bound_ms=bound, status=status)


def static_links(cost: CostModel, parallel: Parallel) -> list[str | None] | None:
    """The link each DP rank's CP group uses (``CostModel.link_of``); None without topology."""
    if cost.topology is None:
        return None
    return [cost.link_of(parallel.cp_group(d)) for d in range(parallel.dp)]


def combine_statuses(statuses: Sequence[str]) -> str:
    """A request's status from its iterations': any timeout, else optimal only if all are."""
    if "timeout" in statuses:
        return "timeout"
    return "optimal" if statuses and all(s == "optimal" for s in statuses) else "feasible"


#: Seconds an iteration's share must hold for a solver process to be forked for it (fork, model build,
#: answer: 64 batches of 256 with one each took 3.6 s on a 0.82 s budget); with less, the warm start stands.
MIN_SOLVE_S = 0.03
#: Seconds per sequence kept back for the plan's floor (``sharding_floor_ms``) after the last iteration.
FLOOR_PER_SEQUENCE_S = 3e-6

#: Solves one iteration: (problem, its ids, the offset of its first id, deadline, kill grace) ->
#: (microbatches, the model's bound in ms, status).
IterationSolve = Callable[[Problem, tuple[int, ...], int, float, float], tuple[Sequence[MicrobatchSpec], float, str]]


def plan_within_budget(problem: Problem, solve_iteration: IterationSolve) -> PlannerOutput:
    """Every iteration in turn with an equal share of the time left. The budget covers the whole solve:
    each solver process is killed at its deadline plus ``kill_grace_s``, and the time to estimate and
    validate the plan (``FINISH_RESERVE_PER_SEQUENCE_S`` per sequence) is kept back.

    The solver's bounds hold over the plans its model expresses (``model_bound_ms``; the static layout
    for ``ilp``); the plan's ``bound_ms`` is ``search.bound.sharding_floor_ms`` of each iteration, valid
    for every layout (a plan with wider groups may beat the static bound)."""
    begin = time.monotonic()
    grace = kill_grace_s(problem.time_budget_s)
    # kept back: the kill grace, the floors computed below (44 ms for 16,384 sequences: 2.7 us each) and the
    # caller's estimating and validating
    reserve_s = grace + (FINISH_RESERVE_PER_SEQUENCE_S + FLOOR_PER_SEQUENCE_S) * len(problem.lengths)
    end = begin + problem.time_budget_s - reserve_s
    iterations, bounds, statuses = [], [], []
    offset = 0
    for k, ids in enumerate(problem.batch_ids):
        share = max(0.0, (end - time.monotonic()) / (len(problem.batch_ids) - k))
        specs, bound, status = solve_iteration(problem, ids, offset, time.monotonic() + share, grace)
        iterations.append(tuple(specs))
        bounds.append(bound)
        statuses.append(status)
        offset += len(ids)
    cost = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens, cp_modes=problem.cp_modes)
    lengths = problem.lengths
    every_layout = [
        min(
            sharding_floor_ms([lengths[i] for s in specs for i in s.seq_ids], cost, problem.parallel),
            cost.iteration_ms(specs, lengths, problem.parallel.num_gpus),
        )
        for specs in iterations
    ]
    # a bound for every layout holds for the model's own (narrower) family too: the model's bound is never
    # reported below it (the solver's dual bound, over floored coefficients, can lie a little under it)
    return PlannerOutput(
        iterations=tuple(iterations),
        status=combine_statuses(statuses),
        bound_ms=sum(every_layout),
        model_bound_ms=sum(max(own, any_layout) for own, any_layout in zip(bounds, every_layout, strict=True)),
    )


def _skrull_groups(problem: Problem, ids: tuple[int, ...]) -> Groups:
    return specs_to_groups(gds_dacp_batch(problem, ids, place=dacp_place), problem.parallel)


def starts_for(starts: Starts, ids: tuple[int, ...], index: int) -> list[Sequence[MicrobatchSpec]]:
    """The ``index``-th iteration of every start that runs exactly the sequences ``ids`` (a start that
    deferred some, or planned another request, is no start for this batch)."""
    wanted = sorted(ids)
    return [
        start[index]
        for start in starts
        if index < len(start) and sorted(i for s in start[index] for i in s.seq_ids) == wanted
    ]


def best_static_hint(problem: Problem, ids: tuple[int, ...], index: int, starts: Starts) -> Groups:
    """The cheapest of the ``skrull`` heuristic's groups and the given static starts for this batch, priced
    as the model prices them (each microbatch in its cheapest allowed mode)."""
    cost = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens, choose_modes=problem.cp_modes)
    candidates = [_skrull_groups(problem, ids)]
    candidates += [
        specs_to_groups(specs, problem.parallel)
        for specs in starts_for(starts, ids, index)
        if is_static(specs, problem.parallel)
    ]
    return min(candidates, key=lambda groups: plan_time_ms(groups, problem.lengths, cost))


class IlpPlanner:
    """The exact joint model (Skrull's static DP x CP layout) warm-started from the ``skrull`` heuristic,
    or from the cheapest static plan of ``starts`` where one is cheaper (``best_static_hint``). Its bound
    and "optimal" are over that layout (``plan_within_budget`` keeps the budget)."""

    name = "ilp"
    #: one time budget is split over the iterations of the whole request
    streams_iterations = False
    #: the ``skrull`` start (its GDS and DACP terms) and a forked solver process building its model (per batch
    #: only where the batch's share holds one: ``MIN_SOLVE_S``)
    budget = Cost(0.06, 2e-5, per_split_s=2e-9, per_slot_s=7e-8)
    #: the mode is a decision of the model per microbatch (solver/ilp/builder.py), assigned to the plan by
    #: ``planning.with_modes``
    cp_modes = CP_MODES

    def __init__(self, backend: str | None = None, *, starts: Starts = ()) -> None:
        self.backend = backend
        self.starts = starts

    def plan(self, problem: Problem) -> PlannerOutput:
        backend = problem.backend or self.backend or DEFAULT_BACKEND
        require_backend(backend, solver=None if problem.backend else self.name)

        def solve_iteration(
            problem: Problem, ids: tuple[int, ...], _offset: int, deadline: float, grace: float
        ) -> tuple[list[MicrobatchSpec], float, str]:
            hint = best_static_hint(problem, ids, problem.batch_ids.index(ids), self.starts)
            result = optimize_iteration(problem, ids, hint, backend=backend, deadline=deadline, grace_s=grace)
            return groups_to_specs(result.groups, problem.parallel), result.bound_ms, result.status

        return plan_within_budget(problem, solve_iteration)


def kill_grace_s(time_budget_s: float) -> float:
    """How long past its deadline a solver process may run before it is killed: within the promise
    ``budget + max(20 ms, 5%)``, leaving room for estimating and validating the plan."""
    return min(0.25, max(0.005, 0.03 * time_budget_s))

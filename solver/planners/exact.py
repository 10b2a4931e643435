"""The ``ilp`` and ``auto`` planners: the exact joint model (solver/ilp) within the request's budget.

* ``ilp``: warm-started from the ``skrull`` heuristic (so never worse than it), solved with SCIP or
  CP-SAT (``backend``), exactly when the model fits ``EXACT_MAX_BINARIES``, else by LNS.
* ``auto``: the best plan found within the budget: the best of the cheap heuristics (``skrull``,
  ``packed``, ``round-robin``), improved by local search, then by the exact model or LNS.

The budget ``time_budget_s`` covers the whole request: each iteration gets an equal share of what is
left, and its solve runs in a child process killed at its deadline (``solver.ilp.runner``). Reported
bounds are the larger of the contract's lower bound and the solver's dual bound (which is valid: the
model floors every time coefficient); ``gap = (objective - bound) / objective``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from skrull.solver.cost import CostModel
from skrull.solver.errors import SkrullError
from skrull.solver.ilp.builder import GroupMicrobatch
from skrull.solver.ilp.runner import Report, run_with_deadline
from skrull.solver.ilp.search import EXACT_MAX_BINARIES, improve_lns, model_size, plan_time_ms, solve_exact
from skrull.solver.planners.base import PlannerOutput, make_spec
from skrull.solver.planners.baselines import packed_batch
from skrull.solver.planners.dacp import dacp_place, round_robin_place
from skrull.solver.planners.dynamic_cp import DynamicCpPlanner
from skrull.solver.planners.hydraulis import HydraulisPlanner
from skrull.solver.planners.local_search import improve
from skrull.solver.planners.skrull import gds_dacp_batch
from skrull.solver.planners.verl_kk import VerlKkPlanner
from skrull.solver.types import MicrobatchSpec, Parallel, Problem

Groups = list[list[GroupMicrobatch]]
DEFAULT_BACKEND = "cpsat"
#: Relative gap under which a solver's "optimal" survives the re-evaluation with exact coefficients.
OPTIMAL_TOLERANCE = 1e-4


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


def groups_to_specs(groups: Groups, parallel: Parallel) -> list[MicrobatchSpec]:
    return [
        make_spec(step=step, ranks=parallel.cp_group(g), local=local, sharded=sharded)
        for g, group in enumerate(groups)
        for step, (local, sharded) in enumerate(group)
    ]


def optimize_iteration(
    problem: Problem, ids: tuple[int, ...], hint: Groups, *, backend: str, deadline: float
) -> IterationResult:
    """Improve ``hint`` for one batch until ``deadline`` (monotonic); never returns a worse plan."""
    cost = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens)
    lengths = problem.lengths
    n = problem.parallel.cp
    lower = cost.lower_bound_ms([lengths[i] for i in ids], problem.parallel)
    if model_size(seq_ids=ids, lengths=lengths, group_size=n, cost=cost, hint=hint) <= EXACT_MAX_BINARIES:

        def work(report: Report, dl: float) -> dict[str, Any]:
            return solve_exact(
                seq_ids=ids,
                lengths=lengths,
                group_size=n,
                cost=cost,
                hint=hint,
                lower_bound_ms=lower,
                backend=backend,
                deadline=dl,
                seed=problem.seed,
                deterministic=problem.deterministic,
                report=report,
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
            )

    outcome = run_with_deadline(work, deadline=deadline)
    payload = outcome.payload or {}
    groups: Groups = payload.get("groups") or hint
    if plan_time_ms(groups, lengths, cost) > plan_time_ms(hint, lengths, cost):
        groups = hint
    bound = max(lower, payload.get("bound_ms") or 0.0)
    objective = plan_time_ms(groups, lengths, cost)
    bound = min(bound, objective)
    if outcome.killed:
        status = "timeout"
    elif payload.get("status") == "optimal" and objective - bound <= OPTIMAL_TOLERANCE * max(objective, 1e-9):
        status = "optimal"
    else:
        status = "feasible"
    return IterationResult(groups=groups, bound_ms=bound, status=status)


def _combine(statuses: list[str]) -> str:
    if "timeout" in statuses:
        return "timeout"
    return "optimal" if statuses and all(s == "optimal" for s in statuses) else "feasible"


def _skrull_groups(problem: Problem, ids: tuple[int, ...]) -> Groups:
    return specs_to_groups(gds_dacp_batch(problem, ids, place=dacp_place), problem.parallel)


class _BudgetedPlanner:
    """Shared loop: split the budget over iterations, optimise each from its starting plan."""

    name = "ilp"

    def __init__(self, backend: str | None = None) -> None:
        self.backend = backend

    def start(self, problem: Problem, ids: tuple[int, ...], deadline: float) -> Groups:
        raise NotImplementedError

    def optimize(self, problem: Problem, *, end: float) -> list[IterationResult]:
        """Every iteration optimised in turn, each with an equal share of the time left until ``end``."""
        backend = problem.backend or self.backend or DEFAULT_BACKEND
        results = []
        for k, ids in enumerate(problem.batch_ids):
            share = (end - time.monotonic()) / (len(problem.batch_ids) - k)
            deadline = time.monotonic() + max(share, 0.0)
            hint = self.start(problem, ids, deadline)
            results.append(optimize_iteration(problem, ids, hint, backend=backend, deadline=deadline))
        return results

    def plan(self, problem: Problem) -> PlannerOutput:
        results = self.optimize(problem, end=time.monotonic() + problem.time_budget_s)
        return PlannerOutput(
            iterations=tuple(tuple(groups_to_specs(r.groups, problem.parallel)) for r in results),
            status=_combine([r.status for r in results]),
            bound_ms=sum(r.bound_ms for r in results),
        )


class IlpPlanner(_BudgetedPlanner):
    """The exact joint model (Skrull's static DP x CP layout) warm-started from the ``skrull`` heuristic.
    Its bound and "optimal" are over that layout."""

    name = "ilp"

    def start(self, problem: Problem, ids: tuple[int, ...], deadline: float) -> Groups:
        return _skrull_groups(problem, ids)


#: Share of auto's budget the peers with flexible layouts (groups wider than CP, heterogeneous
#: replicas) may use; the static optimisation gets the rest.
PEER_BUDGET_FRACTION = 0.2


class AutoPlanner(_BudgetedPlanner):
    """The best plan the project finds within the budget, per iteration, over any layout.

    Static layout: best heuristic, then local search (up to a quarter of the iteration's budget), then
    the exact model or LNS. Flexible layouts: the ``dynamic-cp`` and ``hydraulis`` peers (groups wider
    than CP for the longest sequences, heterogeneous replicas) and ``verl-kk``, which can beat any
    static plan (README "Peers"). Each iteration keeps the fastest candidate. The reported bound must
    hold over every layout, so it is the smaller of the static bound and the layout-free bound
    ``max(sum FLOPs-time / (dp*cp) + microbatch term, FLOPs-time(S_max) / (dp*cp) + microbatch_ms)``.
    """

    name = "auto"

    def start(self, problem: Problem, ids: tuple[int, ...], deadline: float) -> Groups:
        cost = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens)
        lengths = problem.lengths
        candidates = [
            _skrull_groups(problem, ids),
            specs_to_groups(gds_dacp_batch(problem, ids, place=round_robin_place), problem.parallel),
        ]
        candidates.append(specs_to_groups(packed_batch(problem, 0, ids), problem.parallel))
        best = min(candidates, key=lambda g: plan_time_ms(g, lengths, cost))
        now = time.monotonic()
        return improve(
            best, lengths=lengths, cost=cost, group_size=problem.parallel.cp, deadline=now + (deadline - now) / 4
        )

    def plan(self, problem: Problem) -> PlannerOutput:
        begin = time.monotonic()
        end = begin + problem.time_budget_s
        peers = self._flexible_candidates(problem, deadline=begin + PEER_BUDGET_FRACTION * problem.time_budget_s)
        static = self.optimize(problem, end=end)
        cost = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens)
        lengths = problem.lengths
        par = problem.parallel
        iterations = []
        bounds = []
        statuses = []
        for k, result in enumerate(static):
            best = tuple(groups_to_specs(result.groups, par))
            best_ms = _iteration_ms(best, lengths, cost, par)
            for output in peers:
                candidate = output.iterations[k]
                candidate_ms = _iteration_ms(candidate, lengths, cost, par)
                if candidate_ms < best_ms - 1e-9:
                    best, best_ms = candidate, candidate_ms
            ids_lengths = [lengths[i] for i in problem.batch_ids[k]]
            bound = min(result.bound_ms, _layout_free_bound_ms(ids_lengths, cost, par)) if peers else result.bound_ms
            bounds.append(bound)
            optimal = best_ms - bound <= OPTIMAL_TOLERANCE * max(best_ms, 1e-9)
            statuses.append("timeout" if result.status == "timeout" else ("optimal" if optimal else "feasible"))
            iterations.append(best)
        return PlannerOutput(iterations=tuple(iterations), status=_combine(statuses), bound_ms=sum(bounds))

    @staticmethod
    def _flexible_candidates(problem: Problem, *, deadline: float) -> list[PlannerOutput]:
        """Peers' plans that keep every batch in its iteration (nothing deferred)."""
        peer_problem = dataclasses.replace(problem, time_budget_s=max(0.05, deadline - time.monotonic()))
        outputs = []
        for planner in (DynamicCpPlanner(), HydraulisPlanner(), VerlKkPlanner()):
            if time.monotonic() >= deadline:
                break
            try:
                output = planner.plan(peer_problem)
            except SkrullError:
                continue
            if not output.pending and all(
                sorted(i for s in specs for i in s.seq_ids) == list(ids)
                for specs, ids in zip(output.iterations, problem.batch_ids, strict=True)
            ):
                outputs.append(output)
        return outputs


def _iteration_ms(specs: Sequence[MicrobatchSpec], lengths: Sequence[int], cost: CostModel, par: Parallel) -> float:
    return cost.iteration_time_ms(((s.ranks, cost.spec_time_ms(s, lengths)) for s in specs), par.num_gpus)


def _layout_free_bound_ms(lengths: Sequence[int], cost: CostModel, par: Parallel) -> float:
    """The contract's bound with the longest sequence allowed to spread over every GPU (any layout)."""
    if not lengths:
        return 0.0
    everything = cost.lower_bound_ms(lengths, Parallel(dp=1, cp=par.num_gpus))
    return min(cost.lower_bound_ms(lengths, par), everything)

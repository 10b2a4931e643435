"""``ilp-flex``: the exact joint model over flexible layouts, warm-started from ``auto``.

The groups are every block of ``i * cp`` consecutive GPUs starting at a CP-group boundary (group sizes
cp, 2cp, ..., dp*cp), every GPU alone (size 1), and every group the warm start uses (``auto``'s plans
may hold groups of other sizes); a GPU's load is the sum over the groups that contain it
(``solver.ilp.builder.Layout``). So the model chooses, per sequence, the group size as well as the
microbatch and the placement, and compares like with like against ``auto``: its optimum and bound are
over plans made of those groups (the static ``ilp``'s are over the CP groups only).

The model grows with the groups (about K * M * sum(N_g + 1) binaries); it is solved whole when that
fits ``EXACT_MAX_BINARIES`` (tiny requests), otherwise the warm start is returned with the layout-free
bound and status ``feasible``. That bound is ``search.bound.sharding_floor_ms`` (valid for every layout),
also given to the model as a floor on its objective: the model's own relaxation does not reach it (a
fixed cost is charged only by fractional indicators), so without it the solver's bound stays at the
reference lower bound. The budget is shared as for ``ilp``: ``START_SHARE`` of each iteration's
share for the warm start, the rest for the solve, killed at its deadline plus a small grace.

Given ``starts`` (``compare`` passes every heuristic plan of the request that runs all its sequences,
``auto``'s among them), the cheapest start of each batch is the warm start instead and ``auto`` is not
run again: the whole share goes to the solve, and the plan is never worse than any of those starts.

The model's preparation (its layout of groups and its size, before a solver process is forked) is counted
in the budget too: an iteration whose time left after the warm start is shorter than the previous
iteration's preparation took keeps its warm start, and the layout, which depends on the groups only, is
built once per set of groups. So the budget holds at any size (100 batches of 1,000 sequences on DP32 x
CP8 with 10 s took 23 s of wall time when every iteration prepared a model it had no time to solve).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence

from skrull.solver.cost import CostModel
from skrull.solver.cp_modes import CP_MODES
from skrull.solver.ilp.backends import require_backend
from skrull.solver.ilp.builder import GroupMicrobatch, Layout
from skrull.solver.ilp.runner import run_with_deadline
from skrull.solver.ilp.search import EXACT_MAX_BINARIES, model_size
from skrull.solver.plan import MicrobatchSpec, Parallel, Problem
from skrull.solver.planners.auto import AutoPlanner
from skrull.solver.planners.base import OPTIMAL_TOLERANCE, Cost, PlannerOutput, make_spec
from skrull.solver.planners.exact import (
    DEFAULT_BACKEND,
    MIN_SOLVE_S,
    Starts,
    exact_work,
    plan_within_budget,
    starts_for,
)
from skrull.solver.profile import Topology
from skrull.solver.search.bound import sharding_floor_ms
from skrull.solver.search.improve import iteration_ms

#: Share of an iteration's time spent on the warm start (``auto`` on that batch).
START_SHARE = 0.3

Specs = tuple[MicrobatchSpec, ...]


@dataclasses.dataclass(slots=True)
class _Preparation:
    """Seconds the last model's preparation took, within one ``plan`` call."""

    seconds: float = 0.0


@functools.lru_cache(maxsize=8)
def _layout(groups: tuple[tuple[int, ...], ...], num_gpus: int, topology: Topology | None) -> Layout:
    """``Layout.of_groups``, once per set of groups and topology (65 ms at 256 GPUs, the same for most
    iterations); each group on the link its ranks use (the links depend on the topology alone)."""
    return Layout.of_groups(groups, num_gpus, topology)


def flexible_groups(parallel: Parallel, used: Sequence[tuple[int, ...]] = ()) -> list[tuple[int, ...]]:
    """Every GPU alone, every run of whole CP groups (sizes cp .. dp*cp), then the extra ``used`` groups."""
    cp, gpus = parallel.cp, parallel.num_gpus
    groups: list[tuple[int, ...]] = [(g,) for g in range(gpus)]
    for size in range(cp, gpus + 1, cp):
        groups += [tuple(range(s, s + size)) for s in range(0, gpus - size + 1, cp)]
    return list(dict.fromkeys([*groups, *used]))


def to_groups(specs: Sequence[MicrobatchSpec], groups: Sequence[tuple[int, ...]]) -> list[list[GroupMicrobatch]]:
    """Microbatches per group (the group with exactly their ranks), in step order."""
    where = {ranks: g for g, ranks in enumerate(groups)}
    out: list[list[GroupMicrobatch]] = [[] for _ in groups]
    for spec in sorted(specs, key=lambda s: s.step):
        out[where[spec.ranks]].append((spec.local, spec.sharded))
    return out


def to_specs(decoded: Sequence[Sequence[GroupMicrobatch]], groups: Sequence[tuple[int, ...]], gpus: int) -> Specs:
    """Microbatches with steps: each takes the first step free on all of its GPUs (widest groups first)."""
    next_step = [0] * gpus
    out = []
    for g in sorted(range(len(groups)), key=lambda g: -len(groups[g])):
        for local, sharded in decoded[g]:
            step = max(next_step[r] for r in groups[g])
            for r in groups[g]:
                next_step[r] = step + 1
            out.append(make_spec(step=step, ranks=groups[g], local=local, sharded=sharded))
    return tuple(out)


class FlexibleIlpPlanner:
    """The joint model over flexible groups (module docstring), warm-started from ``auto``."""

    name = "ilp-flex"
    #: one time budget is split over the iterations of the whole request
    streams_iterations = False
    #: ``auto``'s start and a forked solver process
    budget = Cost(0.03, 1.5e-5, per_slot_s=1e-8)
    #: the mode is a decision of the model per microbatch (solver/ilp/builder.py), assigned to the plan by
    #: ``planning.with_modes``
    cp_modes = CP_MODES

    def __init__(self, backend: str | None = None, *, starts: Starts = ()) -> None:
        self.backend = backend
        self.starts = starts

    def plan(self, problem: Problem) -> PlannerOutput:
        backend = problem.backend or self.backend or DEFAULT_BACKEND
        require_backend(backend, solver=None if problem.backend else self.name)
        return plan_within_budget(problem, functools.partial(self._iteration, prep=_Preparation()))

    def _iteration(
        self,
        problem: Problem,
        ids: tuple[int, ...],
        offset: int,
        deadline: float,
        grace: float,
        *,
        prep: _Preparation,
    ) -> tuple[Specs, float, str]:
        given = starts_for(self.starts, ids, problem.batch_ids.index(ids))
        if given:
            cost = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens, choose_modes=problem.cp_modes)
            gpus = problem.parallel.num_gpus
            start = min(
                (tuple(specs) for specs in given), key=lambda specs: iteration_ms(specs, problem.lengths, cost, gpus)
            )
        else:
            now = time.monotonic()
            start = _warm_start(problem, ids, offset, now + START_SHARE * (deadline - now))
        return self._solve(problem, ids, start, deadline, grace, prep=prep)

    def _solve(
        self,
        problem: Problem,
        ids: tuple[int, ...],
        start: Specs,
        deadline: float,
        grace: float,
        *,
        prep: _Preparation | None = None,
    ) -> tuple[Specs, float, str]:
        prep = prep or _Preparation()
        # priced as the plan runs, each microbatch in its cheapest allowed mode, which the model decides
        cost = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens, choose_modes=problem.cp_modes)
        lengths = problem.lengths
        par = problem.parallel
        start_ms = iteration_ms(start, lengths, cost, par.num_gpus)
        lower = min(sharding_floor_ms([lengths[i] for i in ids], cost, par), start_ms)
        start_status = "optimal" if start_ms - lower <= OPTIMAL_TOLERANCE * start_ms else "feasible"
        if not ids or time.monotonic() + prep.seconds >= deadline - MIN_SOLVE_S:
            return start, lower, start_status  # no time to prepare and solve a model: the warm start stands
        began = time.monotonic()
        # with Ulysses alone, a group not dividing the heads cannot shard: only the warm start's own groups of
        # such a size stay (it may run local sequences on one; the model shards nothing there)
        used = [s.ranks for s in start]
        groups = [g for g in flexible_groups(par, used) if cost.shards_on(len(g)) or g in used]
        layout = _layout(tuple(groups), par.num_gpus, cost.topology)  # each group on the link its ranks use
        hint = to_groups(start, groups)
        size = model_size(seq_ids=ids, lengths=lengths, group_size=par.cp, cost=cost, hint=hint, layout=layout)
        prep.seconds = time.monotonic() - began
        if size > EXACT_MAX_BINARIES or time.monotonic() >= deadline - MIN_SOLVE_S:
            return start, lower, start_status
        backend = problem.backend or self.backend or DEFAULT_BACKEND

        work = exact_work(
            problem, ids, hint, group_size=par.cp, cost=cost, lower_bound_ms=lower, backend=backend, layout=layout
        )
        outcome = run_with_deadline(work, deadline=deadline, grace_s=grace)
        payload = outcome.payload or {}
        best = start
        if payload.get("groups"):
            found = to_specs(payload["groups"], groups, par.num_gpus)
            assert all(cost.shards_on(len(s.ranks)) for s in found if s.sharded), "the model shards where no mode runs"
            if iteration_ms(found, lengths, cost, par.num_gpus) < iteration_ms(start, lengths, cost, par.num_gpus):
                best = found
        objective = iteration_ms(best, lengths, cost, par.num_gpus)
        bound = min(max(lower, payload.get("bound_ms") or 0.0), objective)
        if outcome.killed:
            return best, bound, "timeout"
        proven = payload.get("status") == "optimal" or objective - bound <= OPTIMAL_TOLERANCE * objective
        return best, bound, "optimal" if proven else "feasible"


def _warm_start(problem: Problem, ids: tuple[int, ...], offset: int, deadline: float) -> Specs:
    """``auto`` on this batch alone (nothing deferred), ids shifted back to the request's."""
    sub = dataclasses.replace(
        problem,
        lengths=tuple(problem.lengths[i] for i in ids),
        batch_ids=(tuple(range(len(ids))),),
        time_budget_s=max(0.0, deadline - time.monotonic()),
    )
    output = AutoPlanner(allow_pending=False).plan(sub)
    return tuple(
        dataclasses.replace(
            s,
            local=tuple(tuple(i + offset for i in part) for part in s.local),
            sharded=tuple(i + offset for i in s.sharded),
        )
        for s in output.iterations[0]
    )

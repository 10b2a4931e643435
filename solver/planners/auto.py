"""``auto``: the best plan the project finds within the budget, over every layout the plan format allows.

One search (docs/auto.md), per chunk of batches (``CHUNK_SEQUENCES``: large requests are planned in
streaming fashion, each chunk with its share of the budget):

1. Constructive starts (``solver.search.starts``): every cheap planner of the project, the peers with
   flexible layouts included (groups wider than CP, heterogeneous replicas, per-sequence / per-document
   sharding, deferral of outliers), each run only when its predicted time fits.
2. The best starts per unit of work (``solver.metrics.work_ms``): per iteration among the starts that
   keep every batch in its iteration, and (only with ``allow_pending``, off by default: a loader that
   trains each global batch in its iteration would leave deferred sequences untrained) a deferring
   start's whole plan when it is close; each is searched with a share of the time and the better per
   unit of work is kept. The peers' child goes on while this process searches (``hydraulis`` on a
   loaded machine, or ``dynamic-cp`` after ``hydraulis`` and ``wlb-keep``, does not fit a 0.1 s budget's
   start phase): it may begin a peer until ``LATE_SHARE`` of the search time is left, and the plans that
   arrived by then are pooled with the best found and searched with it (before, such plans were dropped
   and ``auto`` at 0.1 s per batch could end behind ``hydraulis`` or ``dynamic-cp`` run alone in less
   wall time).
3. Local search (``solver.search.improve``: move / merge / swap / regroup, re-placing every changed
   microbatch) from each alternative start of an iteration, best first, then iterated local search,
   iteration by iteration, each with an equal share of the time left.
4. With ``EXACT_MIN_S`` or more per iteration and a static DP x CP plan, the exact joint model (or LNS)
   from ``planners.exact`` refines the best plan with the time the search leaves; the faster is kept.

With ``deterministic`` the search runs on a work clock (``solver.search.clock``): every start whose
prior (``Start.unit_s``, not the time this machine learnt) fits the chunk's budget runs, in process, the
exact step is left out, and the same request gives the same plan on any machine.

Every step keeps the best plan seen, so ``auto`` never returns a plan slower than its starts. The
reported bound is ``solver.search.bound.microbatch_floor_ms`` of what each iteration runs (the
specification's layout-free bound, tightened by whole microbatches per GPU), valid for every layout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from skrull.solver.cost import CostModel
from skrull.solver.cp_modes import CP_MODES
from skrull.solver.ilp.backends import backend_installed, require_backend
from skrull.solver.plan import MicrobatchSpec, Problem
from skrull.solver.planners.base import OPTIMAL_TOLERANCE, Cost, PlannerOutput
from skrull.solver.planners.exact import (
    DEFAULT_BACKEND,
    groups_to_specs,
    is_static,
    kill_grace_s,
    optimize_iteration,
    specs_to_groups,
)
from skrull.solver.search.bound import microbatch_floor_ms
from skrull.solver.search.budget import FINISH_RESERVE_PER_SEQUENCE_S, microbatch_reserve_s
from skrull.solver.search.clock import Clock, clock_for
from skrull.solver.search.improve import MAX_ALTERNATIVES, iteration_ms, search_iteration
from skrull.solver.search.starts import (
    EVALUATION_PER_SEQUENCE_S,
    STARTS,
    PendingPeers,
    launch_starts,
    run_starts,
)

#: Batches are planned together up to this many sequences per chunk (whole batches; one at least).
CHUNK_SEQUENCES = 4096
#: Share of a chunk's time the starts leave to the local search.
SEARCH_SHARE = 0.2
#: Share of the search time kept for a peer's plan that arrives after the start phase (module doc, step 2).
LATE_SHARE = 0.25
#: Seconds of pricing a late plan may take past the search's deadline (within the finishing margin's order).
LATE_PRICING_S = 0.005
#: Share of an iteration's time the local search gets before the exact model, when that runs.
EXACT_SEARCH_SHARE = 0.3
#: Seconds per iteration from which the exact model is worth starting (forking, building, solving).
EXACT_MIN_S = 1.5
#: Seconds kept back for the caller's estimating and validating, besides the per-sequence share.
FINISH_MARGIN_S = 0.006
#: Seconds per sequence kept back for the objective and bound computed after the last chunk (1.75 us measured
#: on 65,536 Mooncake sequences) and each search's pricing of its result at its deadline (1.4 us).
BOUND_PER_SEQUENCE_S = 4e-6
#: A deferring start is searched from too when its time per unit of work is within this of the best.
DEFERRING_SLACK = 0.05

Specs = tuple[MicrobatchSpec, ...]


class AutoPlanner:
    """Starts, then local search, then the exact model where it pays (module docstring)."""

    name = "auto"
    #: one time budget is shared over the batches (and the exact stage may take a batch's unused share)
    streams_iterations = False
    #: the ``packed`` and ``skrull`` starts (always run; ``skrull`` in a killable child where it is predicted
    #: long), then it stops at its deadline: 15.7 us a sequence in all on 65,536 ShareGPT sequences (7B);
    #: pricing a plan is K * cp (CP 1,024 with ``defer``: 0.19 s where 0.09 s was accepted)
    budget = Cost(0.004, 1e-5, per_slot_s=2e-8)
    #: per microbatch the cheaper of all-gather CP and Ulysses the request allows: the search prices both
    cp_modes = CP_MODES

    def __init__(self, backend: str | None = None, *, allow_pending: bool = False) -> None:
        self.backend = backend
        self.allow_pending = allow_pending

    def plan(self, problem: Problem) -> PlannerOutput:
        if problem.backend is not None:  # a backend the request names is refused if missing, never dropped
            require_backend(problem.backend)
        clock = clock_for(problem.deterministic)
        begin = clock()
        per_sequence = FINISH_RESERVE_PER_SEQUENCE_S + BOUND_PER_SEQUENCE_S
        end = begin + problem.time_budget_s - FINISH_MARGIN_S - per_sequence * len(problem.lengths)
        chunks = _chunks(problem.batch_ids)
        iterations: list[Specs] = []
        pending: list[int] = []
        offset = 0
        for k, chunk in enumerate(chunks):
            deadline = clock() + (end - clock()) / (len(chunks) - k)
            its, pend, reserve_s = self._plan_chunk(problem, chunk, offset, deadline, clock)
            end -= reserve_s  # kept back for finishing this chunk's microbatches: not for the chunks after it
            iterations.extend(its)
            pending.extend(pend)
            offset += sum(len(ids) for ids in chunk)
        cost = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens, choose_modes=problem.cp_modes)
        lengths = problem.lengths
        objective = sum(iteration_ms(specs, lengths, cost, problem.parallel.num_gpus) for specs in iterations)
        bound = sum(
            microbatch_floor_ms([lengths[i] for s in specs for i in s.seq_ids], cost, problem.parallel)
            for specs in iterations
        )
        bound = min(bound, objective)
        optimal = objective - bound <= OPTIMAL_TOLERANCE * max(objective, 1e-9)
        return PlannerOutput(
            iterations=tuple(iterations),
            pending=tuple(sorted(pending)),
            status="optimal" if optimal else "feasible",
            bound_ms=bound,
        )

    def _plan_chunk(
        self, problem: Problem, chunk: Sequence[tuple[int, ...]], offset: int, deadline: float, clock: Clock
    ) -> tuple[list[Specs], list[int], float]:
        """Plan consecutive batches whose ids start at ``offset`` as a problem of their own; also returns the
        seconds kept back from its search for the caller's estimating and validating of its microbatches."""
        stop = offset + sum(len(ids) for ids in chunk)
        sub = dataclasses.replace(
            problem,
            lengths=problem.lengths[offset:stop],
            batch_ids=tuple(tuple(i - offset for i in ids) for ids in chunk),
            time_budget_s=max(0.0, deadline - clock()),
        )
        span = deadline - clock()
        late: PendingPeers | None = None
        if problem.deterministic:  # in process, chosen by their priors alone: the same starts on any machine
            sizes = [len(ids) for ids in sub.batch_ids]
            gpus, cp = sub.parallel.num_gpus, sub.parallel.cp
            # a start whose prior is over the chunk's whole budget is left out (``wlb`` and ``wlb-keep`` at CP
            # 1,024 on 4,096 sequences: 25-30 s predicted, 20-41 s run, where the budget was 3 s of work)
            fitting = [s.name for s in STARTS if s.always or s.unit_s(sizes, gpus=gpus, cp=cp) <= span]
            starts = run_starts(sub, deadline=float("inf"), keep_s=0.0, isolate=False, names=fitting)
        else:
            # without deferral no time goes to starts that defer (``wlb-keep`` is WLB-LLM without its queues)
            names = None if self.allow_pending else [s.name for s in STARTS if not s.defers]
            # the peers' child may begin a peer until the time kept for late plans (module doc, step 2)
            late_s = (1 - LATE_SHARE) * SEARCH_SHARE * span
            starts, peers = launch_starts(
                sub, deadline=deadline, keep_s=SEARCH_SHARE * span, names=names, late_s=late_s
            )
            if peers is not None:  # search the best start so far while the peers run, then pool them all
                cheap = choose_starts(sub, [o for _, o in starts if self.allow_pending or _keeps_batches(o, sub)])
                # the relied-on peers (``hydraulis``, ``dynamic-cp``: docs/auto.md's promise) first: their plans are
                # waited for before the search spends the budget, until only pricing them and finishing the plan
                # are left (searching meanwhile, on a loaded machine, took the CPU their child needed and ran past
                # the deadline; waiting into the finish reserve ran 65,536 sequences 1.6 s past a 10 s budget)
                peers.wait_relied(
                    until=deadline
                    - finish_reserve_s(cheap)
                    - EVALUATION_PER_SEQUENCE_S * len(sub.lengths) * (2 + len(peers.peers))
                )
                found = cheap[0]
                searched = self._improve(sub, found[1], peers.end, clock, exact_model=False)
                interim = PlannerOutput(iterations=tuple(searched), pending=tuple(found[2]))
                keep_until = deadline - LATE_SHARE * (deadline - clock())
                starts = [*starts, ("searched", interim), *peers.collect(keep_until=keep_until)]
                late = peers if peers.busy else None
        # without allow_pending every batch runs in its own iteration: a start that moved a sequence to a later
        # iteration of the request (WLB-LLM's queues, even with nothing left pending) is not a plan to return
        outputs = [o for _, o in starts if self.allow_pending or _keeps_batches(o, sub)]
        # a peer still running at the phase's end (``hydraulis`` on a loaded machine) may finish while this
        # process searches: its plan is pooled with the best found, searched with the time kept for it
        candidates = choose_starts(sub, outputs)
        # estimating and validating the plan grows with its microbatches (0.83 s for 65,536 of them on 2 cores):
        # kept back from this chunk's search, for the best start's count with room for the search to grow it
        reserve_s = finish_reserve_s(candidates)
        deadline -= reserve_s
        search_end = deadline if late is None else deadline - LATE_SHARE * (deadline - clock())
        best = self._search(sub, candidates, search_end, clock)
        if late is not None:
            # a relied-on peer still running (it began late on a loaded machine) is waited for, until the time
            # left holds only the pricing of the plans
            late.wait_relied(until=deadline - EVALUATION_PER_SEQUENCE_S * len(sub.lengths) * (1 + len(late.peers)))
            got = late.collect(until=clock())
            arrived = [o for _, o in got if self.allow_pending or _keeps_batches(o, sub)]
            # pricing each plan is O(sequences), and so is setting a search up: a search only when the time left
            # holds it, the pricing when it does or is within LATE_PRICING_S (a plan that arrives at the deadline
            # on a loaded machine is still weighed; one on 65,536 sequences is not, or it would break the budget)
            evaluation_s = EVALUATION_PER_SEQUENCE_S * len(sub.lengths) * (1 + len(arrived))
            if arrived and (deadline - clock() > evaluation_s or evaluation_s <= LATE_PRICING_S):
                kept = PlannerOutput(iterations=tuple(best[1]), pending=tuple(best[2]))
                pooled = choose_starts(sub, [kept, *arrived])
                if deadline - clock() > evaluation_s:  # search them; else the best of each iteration as it is
                    again = self._search(sub, pooled, deadline, clock)
                else:
                    again = (pooled[0][0], [alts[0] for alts in pooled[0][1]], pooled[0][2])
                best = again if again[0] < best[0] - 1e-12 else best
        shift = [tuple(_shift(s, offset) for s in specs) for specs in best[1]]
        return shift, [i + offset for i in best[2]], reserve_s

    def _search(
        self, problem: Problem, candidates: Sequence[Candidate], deadline: float, clock: Clock
    ) -> tuple[float, list[Specs], list[int]]:
        """Each candidate searched with an equal share of the time left; the best per unit of work."""
        cost = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens, choose_modes=problem.cp_modes)
        best: tuple[float, list[Specs], list[int]] | None = None
        for k, (_, alternatives, pending) in enumerate(candidates):
            share = (deadline - clock()) / (len(candidates) - k)
            iterations = self._improve(problem, alternatives, clock() + share, clock)
            ratio = per_work_ms(iterations, problem.lengths, cost, problem.parallel.num_gpus)
            if best is None or ratio < best[0] - 1e-12:
                best = (ratio, iterations, pending)
        assert best is not None
        return best

    def _improve(
        self,
        problem: Problem,
        alternatives: list[list[Specs]],
        deadline: float,
        clock: Clock,
        *,
        exact_model: bool = True,
    ) -> list[Specs]:
        """Each iteration searched from its alternatives (best first) with an equal share of the time;
        ``exact_model=False`` leaves the exact model out (while the peers' child holds the other core)."""
        cost = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens, choose_modes=problem.cp_modes)
        par = problem.parallel
        lengths = problem.lengths
        out = []
        for k, alts in enumerate(alternatives):
            share = (deadline - clock()) / (len(alternatives) - k)
            it_deadline = clock() + max(0.0, share)
            exact_deadline = it_deadline
            use_exact = (
                exact_model
                and share >= EXACT_MIN_S
                and not problem.deterministic
                and backend_installed(problem.backend or self.backend or DEFAULT_BACKEND)
            )
            if use_exact and is_static(alts[0], par):
                it_deadline = clock() + EXACT_SEARCH_SHARE * share
            best = tuple(
                search_iteration(
                    alts,
                    lengths=lengths,
                    cost=cost,
                    num_gpus=par.num_gpus,
                    deadline=it_deadline,
                    seed=problem.seed,
                    clock=clock,
                )
            )
            ids = tuple(sorted(i for s in best for i in s.seq_ids))
            if use_exact and exact_deadline - clock() >= EXACT_MIN_S / 2 and is_static(best, par) and ids:
                grace = kill_grace_s(exact_deadline - clock())
                result = optimize_iteration(
                    problem,
                    ids,
                    specs_to_groups(best, par),
                    backend=problem.backend or self.backend or DEFAULT_BACKEND,
                    deadline=exact_deadline - grace,
                    grace_s=grace,
                )
                exact = tuple(groups_to_specs(result.groups, par))
                if iteration_ms(exact, lengths, cost, par.num_gpus) < iteration_ms(best, lengths, cost, par.num_gpus):
                    best = exact
            out.append(best)
        return out


Candidate = tuple[float, list[list[Specs]], list[int]]


def choose_starts(problem: Problem, outputs: Sequence[PlannerOutput]) -> list[Candidate]:
    """The plans worth searching from, best per unit of work first: ``(time per unit of work,
    alternatives per iteration (fastest first), pending ids)``.

    The outputs that keep every batch in its iteration (nothing pending) are pooled: each iteration's
    alternatives are their plans of it, fastest first. A deferring output (WLB-LLM's outlier queues)
    is a candidate of its own, per unit of work (``solver.metrics.work_ms``), when it is within
    ``DEFERRING_SLACK`` of the best: the search may turn either into the better plan."""
    cost = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens, choose_modes=problem.cp_modes)
    lengths = problem.lengths
    gpus = problem.parallel.num_gpus

    def runs(specs: Specs) -> bool:
        """Every sharded microbatch on a group an allowed mode runs (with Ulysses alone a peer's start may
        shard over a group not dividing the heads: that iteration of it is left out)."""
        return all(cost.shards_on(len(s.ranks)) for s in specs if s.sharded)

    outputs = [o for o in outputs if _keeps_batches(o, problem) or all(map(runs, o.iterations))]
    in_place = [o for o in outputs if _keeps_batches(o, problem)]
    candidates: list[Candidate] = []
    if in_place:
        pooled = [
            sorted(
                dict.fromkeys(o.iterations[k] for o in in_place if runs(o.iterations[k])),
                key=lambda specs: iteration_ms(specs, lengths, cost, gpus),
            )
            for k in range(len(problem.batch_ids))
        ]
        candidates.append((per_work_ms([alts[0] for alts in pooled], lengths, cost, gpus), pooled, []))
    for o in outputs:
        if o not in in_place:
            ratio = per_work_ms(list(o.iterations), lengths, cost, gpus)
            candidates.append((ratio, [[specs] for specs in o.iterations], list(o.pending)))
    assert candidates, "the cheapest start always runs"
    candidates.sort(key=lambda c: c[0])
    return [c for c in candidates if c[0] <= candidates[0][0] * (1 + DEFERRING_SLACK)]


def finish_reserve_s(candidates: Sequence[Candidate]) -> float:
    """Seconds to keep back for estimating and validating the microbatches of the plan the search returns:
    ``search.budget.microbatch_reserve_s`` of the most microbatches any plan it may return starts from (per
    iteration, the most of the ``MAX_ALTERNATIVES`` alternatives the local search starts from; summed over
    the iterations; the most over the candidates)."""
    return microbatch_reserve_s(
        max(
            sum(max(len(specs) for specs in alts[:MAX_ALTERNATIVES]) for alts in iterations)
            for _, iterations, _ in candidates
        )
    )


def _keeps_batches(output: PlannerOutput, problem: Problem) -> bool:
    return not output.pending and all(
        sorted(i for s in specs for i in s.seq_ids) == list(ids)
        for specs, ids in zip(output.iterations, problem.batch_ids, strict=True)
    )


def per_work_ms(iterations: Sequence[Specs], lengths: Sequence[int], cost: CostModel, gpus: int) -> float:
    """Summed iteration time per unit of work run (``solver.metrics.work_ms``'s per-sequence work)."""
    ms_per_flop = cost.profile.compute.ms_per_tflop / 1e12
    per_token = cost.microbatch_overhead_ms / cost.bucket_tokens
    work = sum(
        ms_per_flop * cost.flops(lengths[i]) + per_token * lengths[i]
        for specs in iterations
        for s in specs
        for i in s.seq_ids
    )
    total = sum(iteration_ms(specs, lengths, cost, gpus) for specs in iterations)
    return total / work if work > 0 else float("inf")


def _chunks(batch_ids: Sequence[tuple[int, ...]]) -> list[list[tuple[int, ...]]]:
    """Consecutive non-empty batches, up to ``CHUNK_SEQUENCES`` sequences per chunk."""
    out: list[list[tuple[int, ...]]] = []
    size = 0
    for ids in batch_ids:
        if not out or size + len(ids) > CHUNK_SEQUENCES:
            out.append([])
            size = 0
        out[-1].append(ids)
        size += len(ids)
    return out


def _shift(spec: MicrobatchSpec, offset: int) -> MicrobatchSpec:
    if offset == 0:
        return spec
    return dataclasses.replace(
        spec,
        local=tuple(tuple(i + offset for i in ids) for ids in spec.local),
        sharded=tuple(i + offset for i in spec.sharded),
    )

"""Deferral on request: ``auto`` may let up to ``k`` sequences of a batch wait one iteration.

Why: a plan runs an iteration in the time of its slowest GPU (eq. 8). When a few sequences leave one GPU
(or one CP group) with more to do than the others, or open one more microbatch on it (one more
``microbatch_ms + compute.fixed_ms``), running them one iteration later can save more time than they
take. WLB-LLM defers outliers by design (``wlb``, docs/planners.md); here deferral is bounded and opt-in
(``"defer": {"max_sequences": k}``, docs/formats.md):

* Batches are taken in order; batch ``b`` runs the sequences carried into it (deferred by batch
  ``b - 1``, or, for batch 0, the request's first ``defer.carried`` sequences, deferred by the previous
  request) and its own. It may defer up to ``k`` of its own, never a carried one: a sequence waits at
  most one iteration. What the last batch defers is the plan's ``pending``; a loader prepends those to its
  next request (worker/dataloader.py). The same stream is deferred the same way whether its batches come
  one or several per request.
* Per batch, ``auto`` plans everything the iteration holds with ``BASE_SHARE`` of the batch's time; that
  plan is searched further (``search.improve.search_iteration``) with ``NO_DEFER_SHARE`` of the rest: the
  option without deferral. Then each removal set below is taken out of the base plan and the rest
  searched again with an equal share of the time left. Removing sequences from a plan never makes a GPU
  slower, so each search starts no slower than the base.
* Removal sets, for ``j`` in 1, 2, 4, ... up to ``k``: the ``j`` longest own sequences (outliers whose
  quadratic FLOPs make a straggler), and ``j`` own sequences of the slowest GPU's microbatches with the
  most time per unit of work (shortest first: a nearly empty extra microbatch).
* Kept: the option with the least time per unit of work, ``T / W`` with ``T`` the iteration's estimate
  (eq. 8) and ``W = sum_S work_ms(S) / (dp * cp)`` of what it runs (``solver.metrics.work_ms``; a plan
  that runs less is not better by that alone). A deferral is kept only when it is at least ``MIN_GAIN``
  below the option without deferral, so deferring never makes an iteration's time per unit of work worse than not
  deferring, and sequences are not reordered for noise.

* WLB-LLM's own plan, as a whole: the per-batch rule above decides each batch by its own iteration, and
  a deferral can lose there and win over two. WLB-LLM moves every outlier of a batch into the next
  (docs/results/2026-11-28-auto-notebook.md: two batches of 256 with four outliers each on 2 x 32 GPUs,
  eight outliers in one iteration sharing the groups better, 0.7% less time for the same work), which leaves iteration
  ``b`` short sequences alone, worse per unit of work than with its outliers. So ``wlb`` plans the whole
  request too: first, in process, when its time fits ``PEER_SHARE`` of the budget (with ``deterministic``
  its prior decides), else in a child on the other core while the batches are planned here
  (``search.starts.launch_peer``; a child of 46 ms of work did not finish within a 0.1 s budget beside
  ``auto``'s own peers on two cores, so the child is for the requests too large to plan first).
  Its plan replaces the per-batch one when it keeps the request's ``defer`` (every sequence in its own
  iteration or within ``max_wait`` after it, at most ``max_sequences`` deferred per batch, carried ones in
  iteration 0, ``pending`` only from the batches within ``max_wait`` of the end: ``keeps_defer``) and is
  ``MIN_GAIN`` lower in time per unit of work over the request. WLB-LLM's queues may hold an outlier for
  several iterations, or past the request from any batch: ``max_wait`` (default 1) is how a request
  allows that; the per-batch rule itself always waits one. (Two lookaheads were tried instead, planning
  the next batch per option; at 0.1 s per batch they lost more to the halved planning time than they won:
  docs/results/2026-11-28-auto-notebook.md.)

``solve.stats`` reports ``deferred_sequences`` and ``ms_per_work`` / ``ms_per_work_without_defer``
(summed times over summed work of the chosen plans and of each iteration's option without deferral). The
second is not the stream planned with no deferral at all: each iteration's option holds what the
iteration before deferred into it, so the two differ by this request's choices only, not by what deferral
gains over a run. With ``deterministic`` every
step runs on a work clock, so the same request gives the same plan on any machine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from skrull.solver.cost import CostModel
from skrull.solver.errors import SkrullError
from skrull.solver.planners.auto import (
    BOUND_PER_SEQUENCE_S,
    FINISH_MARGIN_S,
    AutoPlanner,
    per_work_ms,
)
from skrull.solver.planners.base import OPTIMAL_TOLERANCE, PlannerOutput, make_spec
from skrull.solver.search.bound import microbatch_floor_ms
from skrull.solver.search.budget import FINISH_RESERVE_PER_SEQUENCE_S, microbatch_reserve_s
from skrull.solver.search.clock import Clock, clock_for
from skrull.solver.search.improve import iteration_ms, search_iteration
from skrull.solver.search.starts import EVALUATION_PER_SEQUENCE_S, STARTS, PendingPeers, launch_peer, predicted_s
from skrull.solver.types import Defer, MicrobatchSpec, Problem

#: Share of a batch's time for planning it whole (the plan without deferral); the removal sets share the rest.
BASE_SHARE = 0.5
#: Share of the rest for searching the base further (the option without deferral), before the removal sets.
NO_DEFER_SHARE = 0.4
#: Relative gain in time per unit of work a deferral must bring to be kept (0.1 %).
MIN_GAIN = 1e-3
#: ``wlb``'s whole-request plan is made first, in process, when its time (with ``deterministic``: its prior)
#: fits this share of the budget; else in a child beside the per-batch planning (module doc).
PEER_SHARE = 0.5
#: The planner whose whole-request plan is weighed against the per-batch one.
PEER = "wlb"

Specs = tuple[MicrobatchSpec, ...]


def removal_sizes(max_sequences: int) -> list[int]:
    """``1, 2, 4, ...`` below ``max_sequences``, and ``max_sequences`` itself (none for 0)."""
    sizes: list[int] = []
    j = 1
    while j < max_sequences:
        sizes.append(j)
        j *= 2
    if max_sequences > 0:
        sizes.append(max_sequences)
    return sizes


def remove_sequences(specs: Sequence[MicrobatchSpec], drop: set[int]) -> list[MicrobatchSpec]:
    """``specs`` without the ids in ``drop``; microbatches left empty are dropped. Fewer tokens never
    break memory (eq. 7) and never make a GPU slower (eqs. 1-5 are monotone in every sequence)."""
    out = []
    for s in specs:
        if not drop.intersection(s.seq_ids):
            out.append(s)
            continue
        local = [[i for i in ids if i not in drop] for ids in s.local]
        sharded = [i for i in s.sharded if i not in drop]
        if any(local) or sharded:
            out.append(make_spec(step=s.step, ranks=s.ranks, local=local, sharded=sharded, sharding=s.sharding))
    return out


def work_ms(ids: Sequence[int], lengths: Sequence[int], cost: CostModel, num_gpus: int) -> float:
    """``sum_S work_ms(S) / (dp * cp)`` (``solver.metrics.work_ms``) of the sequences ``ids``."""
    coefficients = cost.coefficients
    return sum(coefficients.work_ms(lengths[i]) for i in ids) / num_gpus


def removal_sets(
    specs: Sequence[MicrobatchSpec],
    deferrable: Sequence[int],
    *,
    lengths: Sequence[int],
    cost: CostModel,
    num_gpus: int,
    max_sequences: int,
    most: int,
) -> list[tuple[int, ...]]:
    """The sets tried (module docstring), distinct, each of at most ``min(max_sequences, most)`` ids."""
    limit = min(max_sequences, most, len(deferrable))
    longest = sorted(deferrable, key=lambda i: (-lengths[i], i))
    own = set(deferrable)
    loads = [0.0] * num_gpus
    for s in specs:
        t = cost.spec_time_ms(s, lengths)
        for g in s.ranks:
            loads[g] += t
    slowest = max(range(num_gpus), key=lambda g: (loads[g], -g)) if num_gpus else 0

    def per_work(s: MicrobatchSpec) -> float:
        w = work_ms(s.seq_ids, lengths, cost, 1) / len(s.ranks)
        return cost.spec_time_ms(s, lengths) / w if w > 0 else float("inf")

    on_slowest = sorted((s for s in specs if slowest in s.ranks), key=lambda s: (-per_work(s), s.step))
    critical = [i for s in on_slowest for i in sorted(s.seq_ids, key=lambda i: (lengths[i], i)) if i in own]
    sets: list[tuple[int, ...]] = []
    for j in removal_sizes(limit):
        for chosen in (longest[:j], critical[:j]):
            key = tuple(sorted(chosen))
            if len(key) == j and key not in sets:
                sets.append(key)
    return sets


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BatchChoice:
    """One batch's outcome: its iteration (ids of the sub-problem), what it defers, and the time per unit
    of work of the chosen plan and of the base plan (no deferral)."""

    specs: Specs
    deferred: tuple[int, ...]
    time_ms: float
    work_ms: float
    base_time_ms: float
    base_work_ms: float
    #: seconds kept back of the batch's budget for estimating and validating its microbatches (``auto``'s
    #: per-microbatch reserve): the caller's later batches must not spend them
    finish_reserve_s: float = 0.0


def plan_batch(
    problem: Problem, deferrable: Sequence[int], *, max_sequences: int, backend: str | None, clock: Clock
) -> BatchChoice:
    """Plan the one batch of ``problem`` (its ``time_budget_s``) and choose what it defers (module doc)."""
    cost = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens, choose_modes=problem.cp_modes)
    lengths = problem.lengths
    gpus = problem.parallel.num_gpus
    ids = problem.batch_ids[0]
    begin = clock()
    end = begin + problem.time_budget_s
    base_problem = dataclasses.replace(problem, time_budget_s=BASE_SHARE * problem.time_budget_s)
    base = AutoPlanner(backend).plan(base_problem).iterations[0]
    # estimating and validating grows with the microbatches (solver/planners/auto.py): kept back from the options
    reserve_s = microbatch_reserve_s(len(base))
    end -= reserve_s
    base_time = iteration_ms(base, lengths, cost, gpus)
    base_work = work_ms(ids, lengths, cost, gpus)
    best = BatchChoice(
        specs=base, deferred=(), time_ms=base_time, work_ms=base_work, base_time_ms=base_time, base_work_ms=base_work,
        finish_reserve_s=reserve_s,
    )  # fmt: skip
    if max_sequences == 0 or base_work <= 0:
        return best
    sets = removal_sets(
        base, deferrable, lengths=lengths, cost=cost, num_gpus=gpus, max_sequences=max_sequences, most=len(ids) - 1
    )
    if problem.deterministic:  # the base planner ran on a work clock of its own: the rest counts from here
        end = clock() + (1 - BASE_SHARE) * problem.time_budget_s - reserve_s
    options: list[tuple[int, ...]] = [(), *sets]  # () searches the base further: the plan without deferral
    reference = float("inf")
    # an option costs O(sequences) besides its search (removing, pricing): tried only while the time left
    # holds that (2 batches of 16,384 with ``max_sequences`` 4: 14 options took 0.66 s of a 0.42 s budget)
    option_s = EVALUATION_PER_SEQUENCE_S * len(ids)
    for k, drop in enumerate(options):
        left = end - clock()
        if k > 0 and left < option_s:
            break
        share = max(0.0, NO_DEFER_SHARE * left if k == 0 else left / (len(options) - k))
        found = tuple(
            search_iteration(
                [remove_sequences(base, set(drop))],
                lengths=lengths,
                cost=cost,
                num_gpus=gpus,
                deadline=clock() + share,
                seed=problem.seed,
                clock=clock,
            )
        )
        # what it runs: the batch less what waits (one pass over the batch per option was 0.4 s on 32,768)
        time_ms, work = iteration_ms(found, lengths, cost, gpus), base_work - work_ms(drop, lengths, cost, gpus)
        ratio = time_ms / work
        if k == 0:
            reference = ratio
            best = BatchChoice(
                specs=found, deferred=(), time_ms=time_ms, work_ms=work, base_time_ms=time_ms, base_work_ms=work,
                finish_reserve_s=reserve_s,
            )  # fmt: skip
        elif ratio < best.time_ms / best.work_ms and ratio <= reference * (1 - MIN_GAIN):
            best = dataclasses.replace(best, specs=found, deferred=drop, time_ms=time_ms, work_ms=work)
    return best


def plan_with_deferral(problem: Problem, defer: Defer, *, backend: str | None = None) -> PlannerOutput:
    """``auto`` with deferral over every batch of ``problem``, in order (module docstring); each batch gets
    an equal share of the time left."""
    if defer.max_sequences == 0:  # nothing may wait: the plan auto makes (carried sequences stay in batch 0)
        return AutoPlanner(backend).plan(problem)
    clock = clock_for(problem.deterministic)
    begin = clock()
    reserve = FINISH_MARGIN_S + (FINISH_RESERVE_PER_SEQUENCE_S + BOUND_PER_SEQUENCE_S) * len(problem.lengths)
    end = begin + problem.time_budget_s - reserve
    cost = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens, choose_modes=problem.cp_modes)
    gpus = problem.parallel.num_gpus
    carried: tuple[int, ...] = ()
    iterations: list[Specs] = []
    choices: list[BatchChoice] = []
    num_batches = len(problem.batch_ids)
    # the whole request by WLB-LLM (module doc): first, in process, where it fits PEER_SHARE of the time;
    # else on the other core while the batches are planned here
    whole, peer = _start_peer(problem, end=end, clock=clock)
    for b, own in enumerate(problem.batch_ids):
        deferrable = [i for i in own if b > 0 or i >= defer.carried]
        ids = tuple(sorted(carried + tuple(own)))
        local = {i: j for j, i in enumerate(ids)}
        sub = dataclasses.replace(
            problem,
            lengths=tuple(problem.lengths[i] for i in ids),
            batch_ids=(tuple(range(len(ids))),),
            time_budget_s=max(0.0, (end - clock()) / (num_batches - b)),
        )
        choice = plan_batch(
            sub, [local[i] for i in deferrable], max_sequences=defer.max_sequences, backend=backend, clock=clock
        )
        choices.append(choice)
        end -= choice.finish_reserve_s  # kept back for finishing this batch: not for the batches after it
        iterations.append(tuple(_renumber(s, ids) for s in choice.specs))
        carried = tuple(ids[j] for j in choice.deferred)
    lengths = problem.lengths
    if peer is not None:
        whole = dict(peer.collect(until=end)).get(PEER)
    if whole is not None and keeps_defer(whole, problem, defer):
        mine = per_work_ms(iterations, lengths, cost, gpus)
        if per_work_ms(list(whole.iterations), lengths, cost, gpus) <= mine * (1 - MIN_GAIN):
            iterations, carried = list(whole.iterations), tuple(whole.pending)
            choices = [_as_choice(specs, b, problem, cost) for b, specs in enumerate(iterations)]
    objective = sum(iteration_ms(specs, lengths, cost, gpus) for specs in iterations)
    bound = sum(
        microbatch_floor_ms([lengths[i] for s in specs for i in s.seq_ids], cost, problem.parallel)
        for specs in iterations
    )
    bound = min(bound, objective)
    optimal = objective - bound <= OPTIMAL_TOLERANCE * max(objective, 1e-9)
    deferred = sum(len(c.deferred) for c in choices)
    chosen_work = sum(c.work_ms for c in choices)
    base_work = sum(c.base_work_ms for c in choices)
    stats = (
        ("deferred_sequences", float(deferred)),
        ("ms_per_work", sum(c.time_ms for c in choices) / chosen_work if chosen_work > 0 else 0.0),
        ("ms_per_work_without_defer", sum(c.base_time_ms for c in choices) / base_work if base_work > 0 else 0.0),
    )
    return PlannerOutput(
        iterations=tuple(iterations),
        pending=tuple(sorted(carried)),
        status="optimal" if optimal else "feasible",
        bound_ms=bound,
        stats=stats,
    )


def _start_peer(problem: Problem, *, end: float, clock: Clock) -> tuple[PlannerOutput | None, PendingPeers | None]:
    """``PEER``'s plan of the whole request made now, in process, when its time fits ``PEER_SHARE`` of the
    time to ``end`` (with ``deterministic`` the budget, and no learnt time: the same decision on any
    machine); else its child, running while the batches are planned, when its time fits before ``end``
    (never with ``deterministic``); or neither.

    Its time: the start's (search/starts.py, learnt), with its ``K * cp`` term (4,096 sequences at CP 1024:
    0.4 s by a prior without it, 30 s run). Not ``WlbPlanner.budget``: that one is the
    budget it is safe to accept (the worst bucket measured), 2-3 times what a 0.5 s request here takes."""
    start = next(s for s in STARTS if s.name == PEER)
    sizes = [len(ids) for ids in problem.batch_ids]
    gpus, cp = problem.parallel.num_gpus, problem.parallel.cp
    if problem.deterministic:
        seconds, left = start.unit_s(sizes, gpus=gpus, cp=cp), problem.time_budget_s
    else:
        seconds, left = predicted_s(start, sizes, gpus=gpus, cp=cp), end - clock()
    if seconds <= PEER_SHARE * left:
        try:
            return start.make().plan(problem), None
        except SkrullError:  # a request it cannot plan: the per-batch plan stands
            return None, None
    if problem.deterministic or seconds > left:
        return None, None
    return None, launch_peer(PEER, problem, deadline=end)


def keeps_defer(output: PlannerOutput, problem: Problem, defer: Defer) -> bool:
    """Whether ``output`` keeps ``defer`` (module doc; the rules ``solver.validate.defer_problems`` checks):
    one iteration per batch, each sequence in its own batch's iteration or within ``max_wait`` after it,
    carried ones in iteration 0, at most ``max_sequences`` deferred per batch, ``pending`` only from the
    batches within ``max_wait`` of the end (with the default wait of one, the last batch)."""
    batches = problem.batch_ids
    if len(output.iterations) != len(batches):
        return False
    batch_of = {i: b for b, ids in enumerate(batches) for i in ids}
    carried = set(batches[0][: defer.carried])  # deferred by the previous request: they never wait again
    deferred = [0] * len(batches)
    seen: set[int] = set()
    for k, specs in enumerate(output.iterations):
        for i in (i for s in specs for i in s.seq_ids):
            b = batch_of.get(i)
            if b is None or i in seen or not b <= k <= b + defer.max_wait or (k > b and i in carried):
                return False
            seen.add(i)
            deferred[b] += k > b
    for i in output.pending:
        b = batch_of.get(i)
        if b is None or len(batches) - b > defer.max_wait or i in seen or i in carried:
            return False
        seen.add(i)
        deferred[b] += 1
    return len(seen) == len(batch_of) and all(n <= defer.max_sequences for n in deferred)


def _as_choice(specs: Specs, b: int, problem: Problem, cost: CostModel) -> BatchChoice:
    """Batch ``b``'s part of a whole-request plan, for ``solve.stats``: what it defers is what of its own
    runs later; the base (no deferral) figures are its own."""
    ran = [i for s in specs for i in s.seq_ids]
    placed = set(ran)
    later = [i for i in problem.batch_ids[b] if i not in placed]
    gpus = problem.parallel.num_gpus
    time_ms = iteration_ms(specs, problem.lengths, cost, gpus)
    work = work_ms(ran, problem.lengths, cost, gpus)
    return BatchChoice(
        specs=specs, deferred=tuple(sorted(later)), time_ms=time_ms, work_ms=work, base_time_ms=time_ms,
        base_work_ms=work,
    )  # fmt: skip


def _renumber(spec: MicrobatchSpec, ids: Sequence[int]) -> MicrobatchSpec:
    """A sub-problem's microbatch in the request's ids (``ids[j]`` for local id ``j``)."""
    return dataclasses.replace(
        spec,
        local=tuple(tuple(ids[j] for j in loc) for loc in spec.local),
        sharded=tuple(ids[j] for j in spec.sharded),
    )

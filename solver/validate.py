"""The independent plan validator: every plan passes it before anyone sees it.

It knows nothing of how planners work; it checks a plan against the request and the specification:

* layout: the plan's ``parallel`` and ``bucket_tokens`` are the request's; iterations are numbered
  0..n-1, one per batch;
* completeness: every sequence id appears exactly once over all iterations (``local`` or ``sharded``) or
  in ``pending``, never in an iteration before its own batch, and no unknown id appears;
* microbatches: ``ranks`` distinct and in ``0..dp*cp-1``; one ``local`` list per rank; nothing sharded on
  a one-GPU group; a known ``sharding`` mode; not empty; every GPU executes its microbatches at distinct
  steps; a known ``mode`` that the request's ``cp_modes`` allow for a microbatch that shards, and for
  ``ulysses`` a profile with ``heads`` and ``comm_a2a`` and a group size dividing ``heads.attention``;
* memory (eq. 7): every GPU within ``bucket_tokens`` in every microbatch, counting the tokens it really
  holds (its local sequences plus the pieces the microbatch's sharding mode cuts for it) and, for an
  all-gather microbatch of a profile with ``memory.kv_bytes_per_token``, the gathered K/V of the rest of
  the sharded sequences (``CostModel.gathered_kv_tokens``: ``r * (N-1)/N * T``, CONTRACT.md, or
  ``r * (2N+1)/(2N) * T`` where ``memory.gathered_kv`` is ``key_prefixes``: ``gathered_kv_factor``);
* deferral (a request with ``defer``, solver/defer.py): every sequence runs in its own batch's iteration
  or within ``defer.max_wait`` (default 1) after it, the request's ``defer.carried`` first sequences in
  iteration 0; no batch defers more than ``defer.max_sequences`` of its own, and only a batch within
  ``max_wait`` of the request's end defers into ``pending`` (it runs first in the next request: with the
  default, the last batch only, so ``len(pending) <= max_sequences``);
* estimates: every ``estimated_ms`` and ``lower_bound_ms`` equals the reference model, the iteration
  estimate is never below its bound; ``solve`` is consistent (objective = summed iteration estimates,
  bound <= objective, gap = (objective - bound) / objective).
"""

from __future__ import annotations

import math

from skrull.solver.cost import CostModel
from skrull.solver.cp_modes import CP_MODES, ULYSSES
from skrull.solver.errors import InvalidPlanError
from skrull.solver.sharding import position_token_counts
from skrull.solver.types import (
    PLAN_SCHEMA,
    SHARDING_MODES,
    SOLVE_STATUSES,
    Iteration,
    Microbatch,
    Parallel,
    Plan,
    Request,
)

#: Estimates must match the reference model to this (ms): plans written elsewhere may round them to 6 decimals
#: (``solver.io`` writes them exactly).
TOLERANCE_MS = 1e-5
#: Relative tolerance of estimate comparisons: float noise of summing in another order, nothing more.
RELATIVE_TOLERANCE = 1e-9
#: ``gap`` must match ``(objective - bound) / objective`` to this: plans written elsewhere may round it to
#: 6 decimals.
GAP_TOLERANCE = 1e-6
#: Sequence ids listed in a "never scheduled" or "more than once" problem; the rest are elided.
IDS_SHOWN = 10


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=RELATIVE_TOLERANCE, abs_tol=TOLERANCE_MS)


class _Ledger:
    """Which sequence ids a plan schedules, where: counts every appearance and reports unknown ids and
    sequences that run before their own batch."""

    def __init__(self, request: Request, problems: list[str]) -> None:
        self.lengths: list[int] = []
        self.batch_of: list[int] = []
        for b, batch in enumerate(request.batches):
            self.lengths.extend(batch)
            self.batch_of.extend([b] * len(batch))
        self.seen = [0] * len(self.lengths)
        self.problems = problems

    def count(self, seq_id: int, where: str, iteration: int | None) -> bool:
        if not 0 <= seq_id < len(self.lengths):
            self.problems.append(f"{where}: unknown sequence id {seq_id}")
            return False
        self.seen[seq_id] += 1
        if iteration is not None and iteration < self.batch_of[seq_id]:
            self.problems.append(
                f"{where}: sequence {seq_id} of batch {self.batch_of[seq_id]} runs early, in iteration {iteration}"
            )
        return True

    def completeness_problems(self) -> list[str]:
        missing = [i for i, n in enumerate(self.seen) if n == 0]
        repeated = [i for i, n in enumerate(self.seen) if n > 1]
        out = []
        if missing:
            out.append(f"sequences never scheduled: {missing[:IDS_SHOWN]}{' ...' if len(missing) > IDS_SHOWN else ''}")
        if repeated:
            more = " ..." if len(repeated) > IDS_SHOWN else ""
            out.append(f"sequences scheduled more than once: {repeated[:IDS_SHOWN]}{more}")
        return out


def layout_problems(plan: Plan, request: Request) -> tuple[list[str], bool]:
    """The plan's schema, layout, bucket and iteration numbering against the request; and whether the
    rest of the plan can be checked at all (its layout and numbering are the request's)."""
    problems: list[str] = []
    par = request.parallel
    if plan.schema != PLAN_SCHEMA:
        problems.append(f"schema is {plan.schema!r}, not {PLAN_SCHEMA!r}")
    if plan.parallel != par:
        problems.append(f"parallel is dp={plan.parallel.dp} cp={plan.parallel.cp}, request has dp={par.dp} cp={par.cp}")
        return problems, False
    if plan.bucket_tokens != request.bucket_tokens:
        problems.append(f"bucket_tokens is {plan.bucket_tokens}, request has {request.bucket_tokens}")
    if [it.index for it in plan.iterations] != list(range(len(request.batches))):
        n_its, n_batches = len(plan.iterations), len(request.batches)
        problems.append(
            f"iterations must be numbered 0..{n_batches - 1}, one per batch: the plan has {n_its} "
            f"iteration{'' if n_its == 1 else 's'}, the request {n_batches} batch{'' if n_batches == 1 else 'es'}"
            " (was the plan made for another request?)"
        )
        return problems, False
    return problems, True


def microbatch_problems(
    mb: Microbatch,
    *,
    where: str,
    iteration: int,
    num_gpus: int,
    model: CostModel,
    ledger: _Ledger,
    empty_allowed: bool = False,
    cp_modes: tuple[str, ...] = ("allgather",),
) -> tuple[list[str], bool, bool]:
    """One microbatch: group, local lists, sharding mode, ids, memory (eq. 7) and estimate (eqs. 1-5);
    whether it is well formed enough to count in its iteration's time, and whether all its ids are known
    (so it counts in the iteration's bound)."""
    problems: list[str] = []
    if not mb.ranks or len(set(mb.ranks)) != len(mb.ranks) or min(mb.ranks) < 0 or max(mb.ranks) >= num_gpus:
        return [f"{where}: ranks {list(mb.ranks)} must be distinct GPUs in 0..{num_gpus - 1}"], False, False
    if len(mb.local) != len(mb.ranks):
        return [f"{where}: {len(mb.local)} local lists for {len(mb.ranks)} ranks"], False, False
    if len(mb.ranks) == 1 and mb.sharded:
        problems.append(f"{where}: sequences sharded over a one-GPU group")
    if mb.sharding not in SHARDING_MODES:
        problems.append(f"{where}: sharding {mb.sharding!r} is not one of {', '.join(SHARDING_MODES)}")
    mode_ok = mb.mode in CP_MODES
    if not mode_ok:
        problems.append(f"{where}: mode {mb.mode!r} is not one of {', '.join(CP_MODES)}")
    elif mb.mode == ULYSSES or (mb.sharded and len(mb.ranks) > 1):
        if mb.mode not in cp_modes:
            problems.append(f"{where}: mode {mb.mode!r} is not allowed by the request's cp_modes {list(cp_modes)}")
        if mb.mode == ULYSSES and not model.profile.plans_ulysses:
            problems.append(f"{where}: mode 'ulysses' needs the profile's heads and comm_a2a")
            mode_ok = False
        elif not model.mode_fits(len(mb.ranks), mb.mode):
            assert model.profile.heads is not None
            problems.append(
                f"{where}: mode 'ulysses' on {len(mb.ranks)} GPUs, which do not divide "
                f"heads.attention = {model.profile.heads.attention}"
            )
            mode_ok = False
    seq_ids = mb.seq_ids
    ok = all(ledger.count(i, where, iteration) for i in seq_ids)
    if not seq_ids and not empty_allowed:  # empty ones only pad counts (equal_microbatches)
        problems.append(f"{where}: holds no sequence")
    if not ok:
        return problems, True, False
    lengths = ledger.lengths
    local_lengths = [[lengths[i] for i in ids] if ids else [] for ids in mb.local]
    sharded_lengths = [lengths[i] for i in mb.sharded]
    if mb.sharding in SHARDING_MODES:
        # each GPU's real tokens: its local sequences plus the pieces the microbatch's split cuts for it
        # plus, in all-gather mode, the gathered K/V of the sharded sequences (CONTRACT.md, in bucket tokens)
        pieces = position_token_counts(mb.sharding, sharded_lengths, len(mb.ranks))
        gathered = model.gathered_kv_tokens(sum(sharded_lengths), len(mb.ranks), mb.mode)
        bucket = model.bucket_tokens - gathered
        over = [
            (sum(lens) + pieces[j], mb.ranks[j])
            for j, lens in enumerate(local_lengths)
            if (lens or pieces[j] > bucket) and sum(lens) + pieces[j] > bucket
        ]
        if over:
            tokens, g = max(over)
            kv = f" and {gathered} tokens' worth of gathered K/V" if gathered else ""
            problems.append(f"{where}: GPU {g} holds {tokens} tokens{kv}, over bucket_tokens={model.bucket_tokens}")
    link = model.link_of(mb.ranks)  # the link its ranks use (None: the profile has no topology)
    if mb.link != link:
        problems.append(f"{where}: link {mb.link!r} != {link!r}, the link its ranks {_ranks_text(mb.ranks)} use")
    if not mode_ok:
        return problems, True, True
    expected = model.microbatch_time_ms(local_lengths, sharded_lengths, mb.mode, link=link)
    if not _close(mb.estimated_ms, expected):
        problems.append(f"{where}: estimated_ms {mb.estimated_ms} != reference {expected:.6f}")
    return problems, True, True


def _ranks_text(ranks: tuple[int, ...]) -> str:
    """A group's ranks for a message, shortened for wide groups."""
    return str(list(ranks)) if len(ranks) <= 8 else f"[{ranks[0]}..{ranks[-1]}] ({len(ranks)} GPUs)"


def step_problems(steps_of_group: dict[tuple[int, ...], list[tuple[int, str]]]) -> list[str]:
    """Every GPU runs its microbatches at distinct steps. Microbatches come grouped by their ``ranks``
    (a plan reuses few groups), so a GPU's steps are gathered per group it belongs to: O(microbatches +
    sum of distinct group sizes) instead of O(microbatches x group size)."""
    groups = list(steps_of_group)
    groups_of_gpu: dict[int, list[int]] = {}
    for k, ranks in enumerate(groups):
        for g in ranks:
            groups_of_gpu.setdefault(g, []).append(k)
    problems: list[str] = []
    checked: set[tuple[int, ...]] = set()
    for g in sorted(groups_of_gpu):
        member_of = tuple(groups_of_gpu[g])
        if member_of in checked:  # the same groups, the same steps: reported once, for the first GPU
            continue
        checked.add(member_of)
        seen: set[int] = set()
        for k in member_of:
            for step, where in steps_of_group[groups[k]]:
                if step in seen:
                    problems.append(f"{where}: GPU {g} has two microbatches at step {step}")
                seen.add(step)
    return problems


def alignment_problems(
    steps_of_group: dict[tuple[int, ...], list[tuple[int, str]]], *, it_index: int, num_gpus: int
) -> list[str]:
    """``equal_microbatches``: every GPU runs a microbatch at every step of the iteration (so the same
    number, each GPU's k-th at the same step as every group it shares). Per group first, then per GPU."""
    steps: list[set[int]] = [set() for _ in range(num_gpus)]
    for ranks, entries in steps_of_group.items():
        group_steps = {step for step, _ in entries}
        for g in ranks:
            steps[g] |= group_steps
    every = set().union(*steps) if steps else set()
    for g, mine in enumerate(steps):
        if mine != every:
            missing = min(every - mine)
            return [
                f"iterations[{it_index}]: equal_microbatches asks every GPU for a microbatch at every step; "
                f"GPU {g} runs none at step {missing} ({len(mine)} microbatches, others up to {len(every)})"
            ]
    return []


def iteration_problems(
    it: Iteration,
    *,
    par: Parallel,
    model: CostModel,
    ledger: _Ledger,
    equal_microbatches: bool = False,
    cp_modes: tuple[str, ...] = ("allgather",),
) -> list[str]:
    """Every microbatch of one iteration, distinct steps per GPU, the iteration estimate (eq. 8) and its
    lower bound (never beaten by a static-layout plan); with ``equal_microbatches``, the same number of
    microbatches on every GPU (empty ones allowed)."""
    problems: list[str] = []
    num_gpus = par.num_gpus
    well_formed: list[tuple[tuple[int, ...], float]] = []
    steps_of_group: dict[tuple[int, ...], list[tuple[int, str]]] = {}
    ids: list[int] = []
    for m, mb in enumerate(it.microbatches):
        where = f"iterations[{it.index}].microbatches[{m}]"
        found, counted, known = microbatch_problems(
            mb,
            where=where,
            iteration=it.index,
            num_gpus=num_gpus,
            model=model,
            ledger=ledger,
            empty_allowed=equal_microbatches,
            cp_modes=cp_modes,
        )
        problems.extend(found)
        if known:
            ids.extend(mb.seq_ids)
        if not counted:
            continue
        well_formed.append((mb.ranks, mb.estimated_ms))
        steps_of_group.setdefault(mb.ranks, []).append((mb.step, where))
    problems.extend(step_problems(steps_of_group))
    if equal_microbatches:
        problems.extend(alignment_problems(steps_of_group, it_index=it.index, num_gpus=num_gpus))
    expected_it = model.iteration_time_ms(well_formed, num_gpus)
    if not _close(it.estimated_ms, expected_it):
        problems.append(f"iterations[{it.index}]: estimated_ms {it.estimated_ms} != reference {expected_it:.6f}")
    ran = [ledger.lengths[i] for i in ids]
    bound = model.lower_bound_ms(ran, par)
    if not _close(it.lower_bound_ms, bound):
        problems.append(f"iterations[{it.index}]: lower_bound_ms {it.lower_bound_ms} != reference {bound:.6f}")
    # the reference bound holds for every layout: a plan that beats it is priced wrong
    if it.estimated_ms < bound - TOLERANCE_MS:
        problems.append(f"iterations[{it.index}]: estimated_ms {it.estimated_ms} beats the lower bound {bound}")
    static_bound = model.static_bound_ms(ran, par)
    if it.static_bound_ms is not None and not _close(it.static_bound_ms, static_bound):
        problems.append(f"iterations[{it.index}]: static_bound_ms {it.static_bound_ms} != reference {static_bound:.6f}")
    static = all(mb.ranks == par.cp_group(mb.ranks[0] // par.cp) for mb in it.microbatches if mb.ranks)
    if it.estimated_ms < static_bound - TOLERANCE_MS and static:
        problems.append(
            f"iterations[{it.index}]: estimated_ms {it.estimated_ms} beats the static-layout bound {static_bound}"
        )
    return problems


def defer_problems(plan: Plan, request: Request) -> list[str]:
    """A request's ``defer`` limits (module docstring); nothing to check without ``defer``."""
    defer = request.defer
    if defer is None:
        return []
    problems: list[str] = []
    batch_of = [b for b, batch in enumerate(request.batches) for _ in batch]
    num_batches = len(request.batches)
    wait = defer.max_wait
    most = "one iteration" if wait == 1 else f"{wait} iterations (defer.max_wait)"
    deferred_from = [0] * num_batches
    for it in plan.iterations:
        for mb in it.microbatches:
            for i in mb.seq_ids:
                if not 0 <= i < len(batch_of):
                    continue  # the ledger reports unknown ids
                if i < defer.carried and it.index != 0:
                    problems.append(
                        f"iterations[{it.index}]: sequence {i} was carried from the previous request "
                        "(defer.carried) and must run in iteration 0"
                    )
                elif it.index > batch_of[i] + wait:
                    problems.append(
                        f"iterations[{it.index}]: sequence {i} of batch {batch_of[i]} waits more than {most}"
                    )
                elif it.index > batch_of[i]:
                    deferred_from[batch_of[i]] += 1
    for i in plan.pending:
        if not 0 <= i < len(batch_of):
            continue
        if i < defer.carried:
            problems.append(f"pending: sequence {i} was carried from the previous request (defer.carried)")
        elif num_batches - batch_of[i] > wait:  # pending runs first in the next request
            problems.append(
                f"pending: sequence {i} of batch {batch_of[i]} would wait {num_batches - batch_of[i]} iterations, "
                f"more than {most}"
            )
        else:
            deferred_from[batch_of[i]] += 1
    for b, n in enumerate(deferred_from):
        if n > defer.max_sequences:
            # with a wait of one, where they went; with a longer wait, from the next iteration on
            where = "pending" if b == num_batches - 1 else f"iterations[{b + 1}{'' if wait == 1 else '..'}]"
            problems.append(
                f"{where}: batch {b} defers {n} sequence{'' if n == 1 else 's'}, more than defer.max_sequences = "
                f"{defer.max_sequences}"
            )
    return problems


def solve_problems(plan: Plan) -> list[str]:
    """The ``solve`` block: a known status, objective = summed iteration estimates, bound <= objective,
    gap = (objective - bound) / objective."""
    problems: list[str] = []
    solve = plan.solve
    if solve.status not in SOLVE_STATUSES:
        problems.append(f"solve.status {solve.status!r} is not one of {', '.join(SOLVE_STATUSES)}")
    objective = sum(it.estimated_ms for it in plan.iterations)
    if not _close(solve.objective_ms, objective):
        problems.append(f"solve.objective_ms {solve.objective_ms} != summed iteration estimates {objective:.6f}")
    if solve.bound_ms is not None:
        if solve.bound_ms > solve.objective_ms + TOLERANCE_MS:
            problems.append(f"solve.bound_ms {solve.bound_ms} is above the objective {solve.objective_ms}")
        if solve.gap is None or (
            solve.objective_ms > 0
            and not math.isclose(
                solve.gap, (solve.objective_ms - solve.bound_ms) / solve.objective_ms, abs_tol=GAP_TOLERANCE
            )
        ):
            problems.append(f"solve.gap {solve.gap} != (objective - bound) / objective")
    if solve.model_bound_ms is not None:
        if solve.model_bound_ms > solve.objective_ms + TOLERANCE_MS:
            problems.append(f"solve.model_bound_ms {solve.model_bound_ms} is above the objective {solve.objective_ms}")
        if solve.model_gap is None or (
            solve.objective_ms > 0
            and not math.isclose(
                solve.model_gap, (solve.objective_ms - solve.model_bound_ms) / solve.objective_ms, abs_tol=GAP_TOLERANCE
            )
        ):
            problems.append(f"solve.model_gap {solve.model_gap} != (objective - model_bound_ms) / objective")
    return problems


def plan_problems(plan: Plan, request: Request) -> list[str]:
    """Every violation of the format and cost-model rules (docs/formats.md) by ``plan`` for ``request``
    (empty when the plan is valid)."""
    problems, checkable = layout_problems(plan, request)
    if not checkable:
        return problems
    ledger = _Ledger(request, problems)
    model = CostModel(request.profile, bucket_tokens=request.bucket_tokens, cp_modes=request.cp_modes)
    for it in plan.iterations:
        problems.extend(
            iteration_problems(
                it,
                par=request.parallel,
                model=model,
                ledger=ledger,
                equal_microbatches=request.equal_microbatches,
                cp_modes=request.cp_modes,
            )
        )
    for i in plan.pending:
        ledger.count(i, "pending", None)
    problems.extend(ledger.completeness_problems())
    problems.extend(defer_problems(plan, request))
    problems.extend(solve_problems(plan))
    return problems


def validate_plan(plan: Plan, request: Request) -> None:
    """Raise ``InvalidPlanError`` listing every violation, or return quietly."""
    problems = plan_problems(plan, request)
    if problems:
        raise InvalidPlanError(problems)

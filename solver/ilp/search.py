"""Exact solves of the joint model and large-neighbourhood search (LNS) around a plan.

Both run inside the budget-keeping child (``runner``) and ``report`` every improvement as a payload:
``{"groups": [[(local ids per CP rank, sharded ids), ...] per group], "bound_ms": float | None,
"status": "optimal" | "feasible"}``.

Where each applies (``EXACT_MAX_BINARIES``): the exact model has about K * G * M * (N + 1) binaries for
K sequences, G DP ranks, M microbatch slots and CP degree N. Up to that size it is solved whole; beyond
it, LNS repeatedly frees the slowest DP rank together with lighter ones (or, when one rank alone is too
big, a few of its microbatches), solves that neighbourhood exactly with everything else fixed, and keeps
the result when the slowest of the freed ranks got faster.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from skrull.solver.cost import CostModel
from skrull.solver.ilp.builder import GroupMicrobatch, Layout, build_joint_model
from skrull.solver.ilp.model import TIME_SCALE, LinearModel
from skrull.solver.ilp.result import BackendResult, IncumbentCallback

#: Largest exact model solved whole (binaries); larger problems go to LNS.
EXACT_MAX_BINARIES = 40_000
#: Largest neighbourhood LNS frees at once (binaries).
LNS_MAX_BINARIES = 3_000
#: Wall-clock seconds given to one LNS neighbourhood.
LNS_STEP_S = 1.0

Groups = list[list[GroupMicrobatch]]
Backend = Callable[..., BackendResult]


def _solve_cpsat(*args: Any, **kwargs: Any) -> BackendResult:
    """CP-SAT (ortools), imported on the first exact solve so that ``import skrull.solver`` needs numpy only."""
    from skrull.solver.ilp.cpsat import solve_cpsat

    return solve_cpsat(*args, **kwargs)


def _solve_scip(*args: Any, **kwargs: Any) -> BackendResult:
    """SCIP (pyscipopt), imported on the first exact solve."""
    from skrull.solver.ilp.scip import solve_scip

    return solve_scip(*args, **kwargs)


BACKENDS: dict[str, Backend] = {"cpsat": _solve_cpsat, "scip": _solve_scip}


def group_time_ms(
    group: Sequence[GroupMicrobatch], lengths: Sequence[int], cost: CostModel, link: str | None = None
) -> float:
    """A group's summed microbatch times, on ``link`` (the link its ranks use, with topology)."""
    return sum(
        cost.microbatch_time_ms([[lengths[i] for i in ids] for ids in local], [lengths[i] for i in sharded], link=link)
        for local, sharded in group
    )


def plan_time_ms(
    groups: Groups, lengths: Sequence[int], cost: CostModel, links: Sequence[str | None] | None = None
) -> float:
    """The slowest static group (``links[g]``: group g's link with topology; None: aligned groups)."""
    return max((group_time_ms(grp, lengths, cost, _link(links, g)) for g, grp in enumerate(groups)), default=0.0)


def _link(links: Sequence[str | None] | None, g: int) -> str | None:
    return links[g] if links else None


def solve_exact(
    *,
    seq_ids: Sequence[int],
    lengths: Sequence[int],
    group_size: int,
    cost: CostModel,
    hint: Groups,
    lower_bound_ms: float,
    backend: str,
    deadline: float,
    seed: int,
    deterministic: bool,
    report: Callable[[Any], None],
    layout: Layout | None = None,
) -> dict[str, Any]:
    """Solve the whole joint model for one iteration (static, or over ``layout``'s groups), reporting
    incumbents; the final payload."""
    built = build_joint_model(
        seq_ids=seq_ids,
        lengths=lengths,
        num_groups=len(hint),
        group_size=group_size,
        cost=cost,
        hint=hint,
        lower_bound_ms=lower_bound_ms,
        layout=layout,
    )

    def on_incumbent(values: list[int], _objective: int, bound: int | None) -> None:
        report({"groups": built.decode(values), "bound_ms": _ms(bound), "status": "feasible"})

    result = BACKENDS[backend](
        built.model,
        time_limit_s=max(0.05, deadline - time.monotonic()),
        deadline=deadline,
        seed=seed,
        deterministic=deterministic,
        on_incumbent=on_incumbent,
    )
    if result.values is None:
        return {"groups": hint, "bound_ms": _ms(result.bound), "status": result.status}
    return {"groups": built.decode(result.values), "bound_ms": _ms(result.bound), "status": result.status}


def _ms(bound: int | None) -> float | None:
    return None if bound is None else bound / TIME_SCALE


def model_size(
    *,
    seq_ids: Sequence[int],
    lengths: Sequence[int],
    group_size: int,
    cost: CostModel,
    hint: Groups,
    max_slots: int | None = None,
    layout: Layout | None = None,
) -> int:
    """Binaries the exact model of this neighbourhood would have (slots as the builder bounds them)."""
    mb_ms = cost.profile.microbatch_ms
    layout = layout or Layout.static(len(hint), group_size)
    times = [group_time_ms(grp, lengths, cost, layout.link(g)) for g, grp in enumerate(hint)]
    times += [0.0] * (len(layout.sizes) - len(hint))
    worst = max((sum(times[g] for g in load) for load in layout.loads), default=0.0)
    slots = len(seq_ids) if mb_ms <= 0 else min(len(seq_ids), int(worst / mb_ms) + 1)
    if max_slots is not None:
        slots = min(slots, max_slots)
    slots = max(slots, max((len(g) for g in hint), default=1), 1)
    return len(seq_ids) * slots * sum(n + 1 for n in layout.sizes)


def improve_lns(
    *,
    groups: Groups,
    lengths: Sequence[int],
    group_size: int,
    cost: CostModel,
    backend: str,
    deadline: float,
    seed: int,
    report: Callable[[Any], None],
    links: Sequence[str | None] | None = None,
) -> dict[str, Any]:
    """LNS around ``groups`` until the deadline; returns the final payload. ``links[g]``: the link static
    group g's ranks use (with topology).

    Each step frees a neighbourhood around the slowest DP rank's slowest microbatch and solves it
    exactly with everything else fixed (as per-group time offsets): whole DP ranks when they fit
    ``LNS_MAX_BINARIES``, else microbatches of the slowest rank together with microbatches of another
    rank (moves sequences across DP ranks) or of the same rank (re-packs and re-places them). A step is
    kept when it lowers the slowest involved rank, or keeps it and lowers their summed time.
    """
    rng = random.Random(seed)
    current = [list(g) for g in groups]
    stale = 0
    step = 0
    while time.monotonic() < deadline - 0.05 and stale < 4 * max(1, len(current)) + 8:
        step += 1
        hood = _neighbourhood(current, lengths, group_size, cost, rng, step, stale, links)
        if hood is not None and _solve_hood(current, hood, lengths, group_size, cost, backend, deadline, rng, links):
            stale = 0
            report({"groups": [list(g) for g in current], "bound_ms": None, "status": "feasible"})
        else:
            stale += 1
    return {"groups": current, "bound_ms": None, "status": "feasible"}


#: A neighbourhood: for each involved DP rank, the indices of its microbatches that are freed.
Hood = dict[int, list[int]]


def _hood_layout(hood: Hood, group_size: int, links: Sequence[str | None] | None) -> Layout:
    """The static layout of a neighbourhood's groups, each on its own link."""
    return Layout.static(len(hood), group_size, [_link(links, g) for g in hood] if links else None)


def _hood_size(
    current: Groups,
    hood: Hood,
    lengths: Sequence[int],
    group_size: int,
    cost: CostModel,
    links: Sequence[str | None] | None = None,
) -> int:
    ids = [i for g, ms in hood.items() for m in ms for i in _mb_ids(current[g][m])]
    hint = [[current[g][m] for m in ms] for g, ms in hood.items()]
    return model_size(
        seq_ids=ids,
        lengths=lengths,
        group_size=group_size,
        cost=cost,
        hint=hint,
        max_slots=_hood_slots(hood),
        layout=_hood_layout(hood, group_size, links),
    )


def _hood_slots(hood: Hood) -> int:
    """LNS lets a neighbourhood use one microbatch more than it frees (a restriction, not a proof)."""
    return max(len(ms) for ms in hood.values()) + 1


def _mb_ids(mb: GroupMicrobatch) -> list[int]:
    local, sharded = mb
    return [i for ids in local for i in ids] + list(sharded)


def _neighbourhood(
    current: Groups,
    lengths: Sequence[int],
    group_size: int,
    cost: CostModel,
    rng: random.Random,
    step: int,
    stale: int,
    links: Sequence[str | None] | None = None,
) -> Hood | None:
    times = [group_time_ms(grp, lengths, cost, _link(links, g)) for g, grp in enumerate(current)]
    order = sorted(range(len(current)), key=lambda g: -times[g])
    crit = order[0]
    if not current[crit]:
        return None
    others = order[1:]
    if stale:
        rng.shuffle(others)
    else:
        others.reverse()  # lightest ranks first

    def fits(hood: Hood) -> bool:
        return _hood_size(current, hood, lengths, group_size, cost, links) <= LNS_MAX_BINARIES

    # Whole DP ranks, when the slowest one fits with at least one other.
    whole: Hood = {crit: list(range(len(current[crit])))}
    for g in others:
        trial = {**whole, g: list(range(len(current[g])))}
        if not fits(trial):
            break
        whole = trial
    if len(whole) > 1:
        return whole
    mb_times = [group_time_ms([mb], lengths, cost, _link(links, crit)) for mb in current[crit]]
    slowest = max(range(len(current[crit])), key=mb_times.__getitem__)
    hood: Hood = {crit: [slowest]}
    if step % 2 and others:
        # Across DP ranks: the slowest microbatch with microbatches of another rank.
        g = others[0]
        for m in rng.sample(range(len(current[g])), len(current[g])):
            trial = {crit: hood[crit], g: [*hood.get(g, []), m]}
            if not fits(trial):
                break
            hood = trial
    else:
        # Within the slowest rank: re-pack its slowest microbatch with a few others.
        for m in rng.sample(range(len(current[crit])), len(current[crit])):
            if m == slowest:
                continue
            trial = {crit: [*hood[crit], m]}
            if not fits(trial) or len(trial[crit]) > 4:
                break
            hood = trial
    return hood if fits(hood) else None


def _solve_hood(
    current: Groups,
    hood: Hood,
    lengths: Sequence[int],
    group_size: int,
    cost: CostModel,
    backend: str,
    deadline: float,
    rng: random.Random,
    links: Sequence[str | None] | None = None,
) -> bool:
    involved = list(hood)
    ids = [i for g in involved for m in hood[g] for i in _mb_ids(current[g][m])]
    hint = [[current[g][m] for m in hood[g]] for g in involved]
    kept = [[mb for m, mb in enumerate(current[g]) if m not in hood[g]] for g in involved]
    offsets = [group_time_ms(k, lengths, cost, _link(links, g)) for g, k in zip(involved, kept, strict=True)]
    whole = all(not k for k in kept)
    built = build_joint_model(
        seq_ids=ids,
        lengths=lengths,
        num_groups=len(involved),
        group_size=group_size,
        cost=cost,
        hint=hint,
        offsets_ms=None if whole else offsets,
        max_slots=_hood_slots(hood),
        layout=_hood_layout(hood, group_size, links),
    )
    result = _run(built.model, backend, deadline, rng.randrange(1 << 30))
    if result.values is None:
        return False
    new = built.decode(result.values)
    old_totals = [group_time_ms(current[g], lengths, cost, _link(links, g)) for g in involved]
    new_totals = [
        off + group_time_ms(grp, lengths, cost, _link(links, g))
        for g, off, grp in zip(involved, offsets, new, strict=True)
    ]
    better_max = max(new_totals) < max(old_totals) - 1e-9
    better_sum = max(new_totals) <= max(old_totals) + 1e-9 and sum(new_totals) < sum(old_totals) - 1e-9
    if not (better_max or better_sum):
        return False
    for g, k, grp in zip(involved, kept, new, strict=True):
        current[g] = k + grp
    return True


def _run(model: LinearModel, backend: str, deadline: float, seed: int) -> BackendResult:
    limit = min(LNS_STEP_S, deadline - time.monotonic() - 0.05)
    if limit <= 0.02:
        return BackendResult(status="unknown", values=None, objective=None, bound=None)
    return BACKENDS[backend](
        model, time_limit_s=limit, deadline=deadline, seed=seed, deterministic=False, num_workers=1
    )


__all__ = ["EXACT_MAX_BINARIES", "IncumbentCallback", "improve_lns", "model_size", "plan_time_ms", "solve_exact"]

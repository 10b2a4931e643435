"""Budgets as promises: the smallest ``time_budget_s`` each planner can keep, the default of a request that
names none, and the early refusal. The one module of the budget rule; each planner declares its own needs
(``Planner.budget``, a ``Cost``), read here through the registry.

A planner's solve (planning, estimating and validating the plan: ``planning.solve``) takes about

    fixed_s + per_sequence_s * K + per_square_s * sum_b K_b^2 + per_rank_square_s * sum_b (K_b / dp)^2
            + per_rank_cube_s * sum_b (K_b / dp)^3 + per_split_s * sum_b K_b^2 / dp
            + per_slot_s * K * cp + per_gpu_s * K * dp * cp
            + per_dp_rank_s * B * dp + FINISH_PER_SEQUENCE_S * K

for K sequences in B batches of K_b over dp x cp GPUs (``Cost.seconds``: the raw estimate; each planner's
figures are its ``budget``, next to its code). The terms are the shapes the planners' work was measured to
follow (``bench/budget_estimates.py``, a loaded 2-core machine): linear for the packers and Skrull; ``K * cp``
for planners whose every microbatch spans a CP group (``deepspeed``, ``sorted``: one local list per GPU per
microbatch to write and validate); ``(K_b / dp)^2`` and ``(K_b / dp)^3`` for verl's Karmarkar-Karp split of each
DP rank's share into microbatches; ``K_b^2 / dp`` (``dp`` ranks of ``K_b / dp`` squared) for Skrull's GDS, which
tries one microbatch count after another for each DP rank, re-placing its microbatches each time, where the
bucket is tight (Qwen2.5-7B's 13,000 tokens with ShareGPT lengths: 8 counts for 64 sequences per rank, 66 for
16,384: 56 us a sequence against 10) and ``K * cp`` for DACP's scan of the group per sequence; ``K_b^2 + K * G``
for dynamic CP's per-sequence group search; WLB-LLM's packing has linear, ``K_b^2``, ``K * cp`` and ``K * G``
parts. The raw estimate is within 2x of the measured wall for every fixed-work planner (the benchmark's table in
docs/benchmarks.md); the smallest budget accepted is ``SAFETY`` times it. Planners that search (``auto``,
``ilp``, ``hydraulis``'s stage-2 ILP) scale their work to the budget, so for them this is only what their first
constructive step and the final checks need. A request whose budget is below the figure is refused before any
work, with a ``RequestError`` naming ``time_budget_s`` and the smallest budget that can work (the service
answers 422), instead of overrunning its budget.

A request that names no budget gets ``default_budget_s``: 1 s (60 s for the exact planners ``ilp`` and
``ilp-flex``, which run until proven optimal or that cap), raised to the smallest budget the planner keeps
for the request's size, and never more than ``MAX_DEFAULT_TIME_BUDGET_S``. A user who asked for no budget
gets a plan, not a refusal for lack of one. A request resolves that default once, when it is built
(``solver.types.Request``); the service, the request's canonical JSON and the planner read the figure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from skrull.solver.errors import RequestError
from skrull.solver.planners.base import FINISH_PER_SEQUENCE_S as FINISH_PER_SEQUENCE_S
from skrull.solver.planners.base import Cost as Cost
from skrull.solver.planners.registry import get_planner, planner_names
from skrull.solver.planners.wlb import KEEP_BUDGET
from skrull.solver.search.budget import FINISH_RESERVE_PER_MICROBATCH_S as FINISH_RESERVE_PER_MICROBATCH_S
from skrull.solver.search.budget import FINISH_RESERVE_PER_SEQUENCE_S as FINISH_RESERVE_PER_SEQUENCE_S
from skrull.solver.search.budget import MICROBATCH_GROWTH as MICROBATCH_GROWTH
from skrull.solver.search.budget import microbatch_reserve_s as microbatch_reserve_s

if TYPE_CHECKING:  # the budget needs only the layout's degrees
    from skrull.solver.plan import Parallel

#: Headroom of the smallest accepted budget over the raw estimate, for a loaded machine.
SAFETY = 2.0
#: Starts of ``auto`` that are no planner of the registry, with their measured needs (search/starts.py).
START_COSTS: dict[str, Cost] = {"wlb-keep": KEEP_BUDGET}


def planner_cost(solver: str) -> Cost | None:
    """The needs ``solver`` declares (``Planner.budget``), or an ``auto`` start's (``START_COSTS``); None for
    a planner that declares none (a plug-in) or an unknown name (refused elsewhere, naming it)."""
    if solver in START_COSTS:
        return START_COSTS[solver]
    try:
        return getattr(get_planner(solver), "budget", None)  # a planner put in the registry by hand may lack it
    except ValueError:
        return None


#: Every built-in planner's measured raw costs (bench/budget_estimates.py), as each declares them.
COSTS: dict[str, Cost] = {
    **{name: cost for name in planner_names() if (cost := planner_cost(name)) is not None},
    **START_COSTS,
}


def estimated_s(solver: str, batch_sizes: Sequence[int], parallel: Parallel | None = None) -> float:
    """The raw estimate of ``solver``'s unavoidable work (module doc; unknown planner: 0)."""
    cost = planner_cost(solver)
    return 0.0 if cost is None else cost.seconds(batch_sizes, parallel)


def plans_batch_by_batch(solver: str) -> bool:
    """Whether ``solver`` plans each batch on its own (``streams_iterations``): the request is then solved as
    one sub-request per batch (``planning.solve_batch``), each paying the fixed part of the work."""
    try:
        return bool(getattr(get_planner(solver), "streams_iterations", False))
    except ValueError:  # an unknown planner is refused elsewhere, naming it
        return False


def batch_needs_s(solver: str, batch_sizes: Sequence[int], parallel: Parallel | None = None) -> list[float]:
    """What each batch needs when ``solver`` plans batch by batch: ``SAFETY`` times its raw estimate."""
    cost = planner_cost(solver)
    return [0.0 if cost is None else SAFETY * cost.seconds([size], parallel) for size in batch_sizes]


def smallest_budget_s(
    solver: str, batch_sizes: Sequence[int], parallel: Parallel | None = None, *, deferring: bool = False
) -> float:
    """The smallest ``time_budget_s`` ``solver`` keeps for batches of these sizes (unknown: 0), for the request
    as it is solved: a planner that streams iterations solves each batch alone with its share of the budget
    (``batch_share_s``), so it needs the sum of what each batch needs; any other the whole request's.

    ``deferring``: the request lets sequences wait (``defer`` with ``max_sequences`` > 0; solver/defer.py),
    so ``auto`` plans each batch alone too, and pays its fixed part once per batch (256 batches of 256
    ShareGPT sequences on Qwen2.5-7B: 2.2 s of planning at least, where 1.2 s covers ``auto`` without it)."""
    if len(batch_sizes) > 1 and (deferring or plans_batch_by_batch(solver)):
        return sum(batch_needs_s(solver, batch_sizes, parallel))
    return SAFETY * estimated_s(solver, batch_sizes, parallel)


def batch_share_s(
    solver: str, batch_sizes: Sequence[int], index: int, time_budget_s: float, parallel: Parallel | None = None
) -> float:
    """Batch ``index``'s share of ``time_budget_s`` when batches are solved one at a time: in proportion to
    what each needs, so a budget that passed ``check_budget`` for the whole request is enough for every batch
    (an even split gave a 300,000-sequence batch next to a 10-sequence one half of what it needs). Without
    estimates (a plug-in planner), an even split."""
    needs = batch_needs_s(solver, batch_sizes, parallel)
    total = sum(needs)
    if total <= 0:
        return time_budget_s / len(batch_sizes)
    return time_budget_s * needs[index] / total


#: The budget of a request that names none, before its size raises it (``default_budget_s``).
DEFAULT_TIME_BUDGET_S = 1.0
#: The exact planners run until proven optimal or this cap when the request names no budget.
EXACT_DEFAULT_TIME_BUDGET_S = 60.0
EXACT_SOLVERS = ("ilp", "ilp-flex")
#: The most a request that names no budget is given (the service caps it further: SKRULL_MAX_TIME_BUDGET_S).
MAX_DEFAULT_TIME_BUDGET_S = 600.0


def default_budget_s(
    solver: str, batch_sizes: Sequence[int], parallel: Parallel | None = None, *, deferring: bool = False
) -> float:
    """The budget of a request that names none (module doc):
    ``min(MAX_DEFAULT, max(base, smallest_budget_s))`` with ``base`` 1 s, or 60 s for an exact planner."""
    base = EXACT_DEFAULT_TIME_BUDGET_S if solver in EXACT_SOLVERS else DEFAULT_TIME_BUDGET_S
    need = _round_up(smallest_budget_s(solver, batch_sizes, parallel, deferring=deferring))
    return min(MAX_DEFAULT_TIME_BUDGET_S, max(base, need))


def check_budget(
    solver: str,
    batch_sizes: Sequence[int],
    time_budget_s: float,
    parallel: Parallel | None = None,
    *,
    deferring: bool = False,
) -> None:
    """Refuse, before any work, a budget the planner cannot keep (``deferring``: ``smallest_budget_s``)."""
    need = smallest_budget_s(solver, batch_sizes, parallel, deferring=deferring)
    if time_budget_s < need * (1 - 1e-9):  # a proportional share (batch_share_s) may round below its need
        raise RequestError(
            "time_budget_s",
            time_budget_s,
            f"{solver!r}{' with defer' if deferring else ''} needs at least {_round_up(need)} s "
            f"for {sum(batch_sizes)} sequences "
            f"in {len(batch_sizes)} batch{'' if len(batch_sizes) == 1 else 'es'}; ask for time_budget_s >= "
            f"{_round_up(need)}",
        )


def _round_up(seconds: float) -> float:
    """Two significant digits, rounded up (so the figure quoted always works)."""
    if seconds <= 0:
        return 0.0
    factor = 10.0 ** (1 - math.floor(math.log10(seconds)))
    return math.ceil(seconds * factor) / factor

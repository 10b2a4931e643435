"""Budgets as promises: the smallest ``time_budget_s`` each planner can keep, and the early refusal.

A planner's solve (planning, estimating and validating the plan: ``planning.solve``) takes about

    fixed_s + per_sequence_s * K + per_square_s * sum_b K_b^2 + per_rank_square_s * sum_b (K_b / dp)^2
            + per_rank_cube_s * sum_b (K_b / dp)^3 + per_split_s * sum_b K_b^2 / dp
            + per_slot_s * K * cp + per_gpu_s * K * dp * cp
            + per_dp_rank_s * B * dp + FINISH_PER_SEQUENCE_S * K

for K sequences in B batches of K_b over dp x cp GPUs (``Cost.seconds``: the raw estimate). The terms are the
shapes the planners' work was measured to follow (``bench/budget_estimates.py``, a loaded 2-core machine):
linear for the packers and Skrull; ``K * cp`` for planners whose every microbatch spans a CP group
(``deepspeed``, ``sorted``: one local list per GPU per microbatch to write and validate); ``(K_b / dp)^2`` and
``(K_b / dp)^3`` for verl's Karmarkar-Karp split of each DP rank's share into microbatches; ``K_b^2 / dp``
(``dp`` ranks of ``K_b / dp`` squared) for Skrull's GDS, which tries one microbatch count after another for
each DP rank, re-placing its microbatches each time, where the bucket is tight (Qwen2.5-7B's 13,000 tokens
with ShareGPT lengths: 8 counts for 64 sequences per rank, 66 for 16,384: 56 us a sequence against 10) and
``K * cp`` for DACP's scan of the group per sequence; ``K_b^2 + K * G`` for dynamic CP's per-sequence group
search; WLB-LLM's packing has linear, ``K_b^2``, ``K * cp`` and ``K * G`` parts. The raw estimate is within 2x
of the measured wall for every fixed-work planner (the benchmark's table in docs/benchmarks.md); the smallest
budget accepted is ``SAFETY`` times it. Planners that search (``auto``, ``ilp``, ``hydraulis``'s stage-2 ILP)
scale their work to the budget, so for them this is only what their first constructive step and the final
checks need. A request whose budget is below the figure is refused before any work, with a ``RequestError``
naming ``time_budget_s`` and the smallest budget that can work (the service answers 422), instead of
overrunning its budget.

A request that names no budget gets ``default_budget_s``: 1 s (60 s for the exact planners ``ilp`` and
``ilp-flex``, which run until proven optimal or that cap), raised to the smallest budget the planner keeps
for the request's size, and never more than ``MAX_DEFAULT_TIME_BUDGET_S``. A user who asked for no budget
gets a plan, not a refusal for lack of one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from skrull.solver.errors import RequestError

if TYPE_CHECKING:  # solver.types reads its default budget from here: no import back at run time
    from skrull.solver.types import Parallel

#: Estimating and validating a plan, per sequence (measured 1.2 us on one core).
FINISH_PER_SEQUENCE_S = 1.2e-6
#: Headroom of the smallest accepted budget over the raw estimate, for a loaded machine.
SAFETY = 2.0
#: What a searching planner keeps back of its budget per sequence to finish (estimate and validate): 3.9 us
#: measured for 65,536 ShareGPT sequences on Qwen2.5-7B's profile (many small microbatches).
FINISH_RESERVE_PER_SEQUENCE_S = 4e-6
#: And per microbatch of the plan, on top: estimating and validating 65,536 Mooncake sequences on DP64 x CP8
#: (Qwen2.5-0.5B) took 0.50 s with Skrull's 26,929 microbatches and 0.83 s with one sequence per microbatch
#: (ShareGPT, 960 microbatches: 0.12 s), about 2 us per sequence and 10.6 us per microbatch; a search that
#: kept back the per-sequence share alone ran 0.25 s past a 10 s budget.
FINISH_RESERVE_PER_MICROBATCH_S = 1.1e-5
#: The most a plan's microbatch count is taken to grow in a local search (its merges and moves rarely split).
MICROBATCH_GROWTH = 1.25


def microbatch_reserve_s(num_microbatches: int) -> float:
    """Seconds a searching planner keeps back for estimating and validating a plan searched from one of
    ``num_microbatches``: ``FINISH_RESERVE_PER_MICROBATCH_S * MICROBATCH_GROWTH`` each."""
    return FINISH_RESERVE_PER_MICROBATCH_S * MICROBATCH_GROWTH * num_microbatches


@dataclass(frozen=True, slots=True)
class Cost:
    fixed_s: float
    per_sequence_s: float
    per_square_s: float = 0.0
    per_rank_square_s: float = 0.0
    per_rank_cube_s: float = 0.0
    per_split_s: float = 0.0
    per_slot_s: float = 0.0
    per_gpu_s: float = 0.0
    per_dp_rank_s: float = 0.0

    def seconds(self, batch_sizes: Sequence[int], parallel: Parallel | None = None) -> float:
        """The raw estimate (module doc); without ``parallel``, one GPU."""
        dp, cp = (parallel.dp, parallel.cp) if parallel is not None else (1, 1)
        num = sum(batch_sizes)
        return (
            self.fixed_s
            + self.per_sequence_s * num
            + self.per_square_s * sum(b * b for b in batch_sizes)
            + self.per_rank_square_s * sum((b / dp) ** 2 for b in batch_sizes)
            + self.per_rank_cube_s * sum((b / dp) ** 3 for b in batch_sizes)
            + self.per_split_s * sum(b * b for b in batch_sizes) / dp
            + self.per_slot_s * num * cp
            + self.per_gpu_s * num * dp * cp
            + self.per_dp_rank_s * len(batch_sizes) * dp
            + FINISH_PER_SEQUENCE_S * num
        )


#: Measured raw costs of each planner's unavoidable work (bench/budget_estimates.py).
COSTS: dict[str, Cost] = {
    # the ``packed`` and ``skrull`` starts (always run; ``skrull`` in a killable child where it is predicted
    # long), then it stops at its deadline: 15.7 us a sequence in all on 65,536 ShareGPT sequences (7B);
    # pricing a plan is K * cp (CP 1,024 with ``defer``: 0.19 s where 0.09 s was accepted)
    "auto": Cost(0.004, 1e-5, per_slot_s=2e-8),
    "packed": Cost(0.001, 2e-6),  # 2.4-3.5 us a sequence measured in all (ShareGPT on Qwen2.5-7B: small microbatches)
    "xtuner": Cost(0.001, 2e-6),  # packing as ``packed`` does
    # 1.2-1.8 us per sequence and CP rank at CP 1,024 (4,096 sequences: 5.2-7.5 s)
    "deepspeed": Cost(0.001, 20e-6, per_slot_s=1.6e-6),
    "sorted": Cost(0.001, 20e-6, per_slot_s=1.6e-6),
    "skrull": Cost(0.001, 6e-6, per_split_s=2e-9, per_slot_s=7e-8),
    "round-robin": Cost(0.001, 6e-6, per_split_s=2e-9, per_slot_s=7e-8),
    # each DP rank's split set up per batch (64 ranks: 0.14 s for 8,192 sequences); 0.78 s for 8,192 ShareGPT
    # sequences on Qwen2.5-7B at DP 4, 15.2 s for 16,384 at DP 2
    "verl-kk": Cost(0.002, 5e-6, per_rank_square_s=1.2e-7, per_rank_cube_s=8.6e-12, per_dp_rank_s=1.5e-3),
    # the ``skrull`` start (its GDS and DACP terms) and a forked solver process building its model (per batch
    # only where the batch's share holds one: ``exact.MIN_SOLVE_S``)
    "ilp": Cost(0.06, 2e-5, per_split_s=2e-9, per_slot_s=7e-8),
    "ilp-flex": Cost(0.03, 1.5e-5, per_slot_s=1e-8),  # ``auto``'s start and a forked solver process
    # 15.8 s for one batch of 16,384 on DP 1 (its strategy search), where 10 s was accepted
    "hydraulis": Cost(0.01, 3.2e-4, per_square_s=8e-9, per_slot_s=4.8e-6),
    # its step filling kept in heaps, with the sequences sure to wait skipped (0.6 s for 16,384 ShareGPT
    # sequences on one DP rank, 26.7 s before); a little per batch and DP rank (64 batches: 0.5 s)
    "dynamic-cp": Cost(0.005, 2e-5, per_square_s=1.5e-9, per_gpu_s=8e-8, per_dp_rank_s=5e-4),
    # WLB-LLM 2.5-4x its earlier fit (pricing both CP modes, tight buckets): 7.2 s for 16,384 ShareGPT sequences
    "wlb": Cost(0.005, 9e-5, per_square_s=9e-9, per_slot_s=1.7e-5, per_gpu_s=1.8e-7),
    # auto's start: wlb without the outlier queues (no queue search; ~0.8 of wlb)
    "wlb-keep": Cost(0.005, 7e-5, per_square_s=7.4e-9, per_slot_s=1.3e-5, per_gpu_s=1.4e-7),
}


def estimated_s(solver: str, batch_sizes: Sequence[int], parallel: Parallel | None = None) -> float:
    """The raw estimate of ``solver``'s unavoidable work (module doc; unknown planner: 0)."""
    cost = COSTS.get(solver)
    return 0.0 if cost is None else cost.seconds(batch_sizes, parallel)


def plans_batch_by_batch(solver: str) -> bool:
    """Whether ``solver`` plans each batch on its own (``streams_iterations``): the request is then solved as
    one sub-request per batch (``planning.solve_batch``), each paying the fixed part of the work."""
    from skrull.solver.planners.registry import get_planner  # the registry's planners import this module

    try:
        return bool(getattr(get_planner(solver), "streams_iterations", False))
    except ValueError:  # an unknown planner is refused elsewhere, naming it
        return False


def batch_needs_s(solver: str, batch_sizes: Sequence[int], parallel: Parallel | None = None) -> list[float]:
    """What each batch needs when ``solver`` plans batch by batch: ``SAFETY`` times its raw estimate."""
    return [SAFETY * estimated_s(solver, [size], parallel) for size in batch_sizes]


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

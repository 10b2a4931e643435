"""The ``skrull`` planner: GDS (Alg. 2) feeding DACP (Alg. 1 with RollBack, Alg. 3), per iteration.

Also the ``round-robin`` planner of Skrull appendix B.2 (same GDS, memory-only in-group placement),
which the paper's case study (Table 3) compares against. Both never exceed a memory bucket: every
microbatch passes eq. 7 by construction (integer bookkeeping in ``dacp``) and GDS falls back to more
microbatches when placement fails.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from skrull.solver.cost import CostModel
from skrull.solver.cp_modes import CP_MODES
from skrull.solver.plan import MicrobatchSpec, Problem
from skrull.solver.planners.base import Cost, PlannerOutput, make_spec, plan_each_iteration
from skrull.solver.planners.dacp import SHARDED, dacp_place, round_robin_place
from skrull.solver.planners.gds import Placer, balance_dp, split_rank


def gds_dacp_batch(
    problem: Problem, ids: tuple[int, ...], *, place: Placer, rollback: bool = True
) -> list[MicrobatchSpec]:
    """Plan one global batch: LPT over DP ranks by FLOPs, then each rank's microbatches and placement."""
    model = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens)
    lengths = problem.lengths
    par = problem.parallel
    flops_cache: dict[int, float] = {}

    def flops(s: int) -> float:
        f = flops_cache.get(s)
        if f is None:
            f = flops_cache[s] = model.flops(s)
        return f

    gathered = _gathered_kv(problem)
    bins = balance_dp(ids, [flops(lengths[i]) for i in ids], par.dp)
    specs: list[MicrobatchSpec] = []
    for dp_rank, rank_ids in enumerate(bins):
        ranks = par.cp_group(dp_rank)
        microbatches = split_rank(
            rank_ids,
            lengths,
            group_size=par.cp,
            bucket_tokens=problem.bucket_tokens,
            place=place,
            flops=flops,
            rollback=rollback,
            gathered=gathered,
        )
        for step, (mb_ids, placement) in enumerate(microbatches):
            specs.append(_spec(step, ranks, mb_ids, placement))
    return specs


def _gathered_kv(problem: Problem) -> Callable[[int], int] | None:
    """Bucket tokens each GPU of a CP group keeps of the gathered K/V for T sharded tokens, in the mode that
    keeps least among those the problem allows (Ulysses none: ``with_modes`` then picks a mode that fits);
    None where the profile charges none (every check as in the paper)."""
    view = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens, choose_modes=problem.cp_modes)
    if not view.gathered_kv_ratio:
        return None
    cp = problem.parallel.cp
    return lambda sharded_tokens: view.view_gathered_kv_tokens(sharded_tokens, cp)


def _spec(step: int, ranks: tuple[int, ...], ids: Sequence[int], placement: Sequence[int]) -> MicrobatchSpec:
    local: list[list[int]] = [[] for _ in ranks]
    sharded: list[int] = []
    for i, where in zip(ids, placement, strict=True):
        if where == SHARDED:
            sharded.append(i)
        else:
            local[where].append(i)
    return make_spec(step=step, ranks=ranks, local=local, sharded=sharded)


class SkrullPlanner:
    """GDS + DACP heuristic (Skrull section 4.3), faithful to Algs. 1-3; see ``dacp`` and ``gds``."""

    name = "skrull"
    #: GDS + DACP place each batch from that batch alone
    streams_iterations = True
    #: GDS tries microbatch counts per DP rank (``K_b^2 / dp``), DACP scans the group per sequence (``K * cp``)
    budget = Cost(0.001, 6e-6, per_split_s=2e-9, per_slot_s=7e-8)
    #: DACP extended: each microbatch's sharded sequences run all-gather or Ulysses, whichever is cheaper
    cp_modes = CP_MODES

    def plan(self, problem: Problem) -> PlannerOutput:
        return plan_each_iteration(problem, lambda p, _i, ids: gds_dacp_batch(p, ids, place=dacp_place))


class RoundRobinPlanner:
    """GDS microbatches with Skrull appendix B.2's round-robin in-group placement (with rollback)."""

    name = "round-robin"
    #: each batch is placed from that batch alone
    streams_iterations = True
    #: as ``skrull``
    budget = SkrullPlanner.budget

    def plan(self, problem: Problem) -> PlannerOutput:
        return plan_each_iteration(problem, lambda p, _i, ids: gds_dacp_batch(p, ids, place=round_robin_place))

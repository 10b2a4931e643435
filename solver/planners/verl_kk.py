"""``verl-kk``: verl's sequence balancing with Karmarkar-Karp, as its PPO trainer and workers use it.

What was checked against the public code (volcengine/verl at b178a3c, January 2026; facts only):

* DP balancing lives in the PPO trainer, not the SFT trainer: ``RayPPOTrainer._balance_batch``
  (verl/trainer/ppo/ray_trainer.py) partitions the rollout batch over the DP ranks with KK and
  ``equal_size=True``; ``verl/trainer/fsdp_sft_trainer.py`` uses none of ``seqlen_balancing``. This
  planner applies the PPO trainer's DP step to an SFT batch: a departure.
* Microbatches: ``rearrange_micro_batches`` (verl/utils/seqlen_balancing.py, used by the actor and critic
  workers under ``use_dynamic_bsz``) takes ``m = min(len, ceil(sum(S) / max_token_len))`` and a KK
  partition with free counts; ``max_token_len`` is only asserted to be at least the longest sequence,
  parts are not checked against it.
* Workload ``calculate_workload`` = ``24576*S + S^2``.

What this planner does:

1. Balance the global batch over the DP ranks: a Karmarkar-Karp k-way partition (largest differencing
   method, Karmarkar & Karp 1982) of the sequences' workloads with *equal counts* per rank (verl asserts
   that k divides the count; here zero-weight placeholders pad it, so counts differ by at most one).
2. Dynamic batch size per rank: ``m = ceil(sum(S) / max_token_len)`` microbatches, then a second KK
   partition of that rank's workloads into m parts (counts free).
3. Workload ``24576*S + S^2`` in verl: a linear (GEMM) term plus the quadratic attention term with the
   ratio of one model. Here the same shape comes from the profile: ``FLOPs(S) = flops_per_token*S +
   flops_per_token_sq*S^2`` (Skrull eq. 13), so the ratio is the model's, not a constant.
4. Every sequence is sharded over the rank's whole sequence-parallel (CP) group (Ulysses in verl).
5. Microbatches are ordered with the lighter ones at the ends (verl's ``use_dynamic_bsz_balance``, for a
   pipeline's warm-up and cool-down); the reference cost model has no pipeline, so this changes no estimate,
   only the step order.

The known failure: KK balances workload, not tokens, so a part can exceed ``max_token_len`` and the run
runs out of memory (``max_token_len`` is only used to count microbatches). A plan here must be valid, so
the planner checks every part against the memory bucket (``sum(S) <= cp * bucket_tokens`` for an
all-sharded microbatch, eq. 7) and, where a part is over, repartitions with one more microbatch. How
often that happened is reported in ``solve.stats`` as ``token_cap_repartitions`` (each one an OOM the
plain verl recipe would have hit).

KK details (choices where the method leaves room): a state is k subsets with their sums; the heap is
ordered by spread (max - min sum), ties by creation order; merging two states joins the heaviest subset
of one with the lightest of the other, and so on. With equal counts, the items are sorted by weight and
cut into groups of k consecutive items, each group a state with one item per subset (padded with
zero-weight placeholders when k does not divide the count, so counts differ by at most one).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

from skrull.solver.cost import CostModel
from skrull.solver.errors import InfeasibleError
from skrull.solver.gathered import group_capacity_tokens
from skrull.solver.plan import MicrobatchSpec, Problem
from skrull.solver.planners.base import Cost, PlannerOutput, all_sharded

_State = list[tuple[float, list[int]]]  # k (sum, item positions) pairs, heaviest first


def karmarkar_karp(weights: Sequence[float], num_parts: int, *, equal_size: bool = False) -> list[list[int]]:
    """Partition positions ``0..len(weights)-1`` into ``num_parts`` lists by the largest differencing
    method; with ``equal_size`` the part sizes differ by at most one. Parts come heaviest first, each
    list in ascending position order."""
    if num_parts < 1:
        raise ValueError(f"num_parts must be >= 1, got {num_parts}")
    k = num_parts
    counter = itertools.count()
    heap: list[tuple[float, int, _State]] = []

    def push(state: _State) -> None:
        state.sort(key=lambda part: -part[0])
        heapq.heappush(heap, (-(state[0][0] - state[-1][0]), next(counter), state))

    if equal_size:
        order = sorted(range(len(weights)), key=lambda i: (weights[i], i))
        order += [-1] * ((-len(order)) % k)  # placeholders of weight 0
        for start in range(0, len(order), k):
            push([(weights[i] if i >= 0 else 0.0, [i] if i >= 0 else []) for i in order[start : start + k]])
    else:
        for i, w in enumerate(weights):
            push([(w, [i])] + [(0.0, []) for _ in range(k - 1)])
    if not heap:
        return [[] for _ in range(k)]
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        b_light_first = sorted(b, key=lambda part: part[0])
        push([(sa + sb, ia + ib) for (sa, ia), (sb, ib) in zip(a, b_light_first, strict=True)])
    _, _, final = heap[0]
    return [sorted(items) for _, items in final]


def _ends_light(parts: list[list[int]], loads: list[float]) -> list[list[int]]:
    """Order parts light - heavy - light: ascending loads dealt alternately to the front and the back."""
    order = sorted(range(len(parts)), key=lambda j: (loads[j], j))
    front: list[int] = []
    back: list[int] = []
    for n, j in enumerate(order):
        (front if n % 2 == 0 else back).append(j)
    return [parts[j] for j in front + back[::-1]]


def verl_kk_batch(
    problem: Problem, ids: Sequence[int], *, flops: dict[int, float] | None = None
) -> tuple[list[MicrobatchSpec], int]:
    """One global batch: KK over DP ranks (equal counts), then per rank KK into the fewest microbatches
    whose parts all fit the bucket. Returns the microbatches and the number of repartitions the token
    cap forced."""
    model = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens)
    lengths = problem.lengths
    par = problem.parallel
    capacity = group_capacity_tokens(problem)
    cache = flops if flops is not None else {}

    def work(i: int) -> float:
        s = lengths[i]
        f = cache.get(s)
        if f is None:
            f = cache[s] = model.flops(s)
        return f

    ranks_parts = karmarkar_karp([work(i) for i in ids], par.dp, equal_size=True)
    specs: list[MicrobatchSpec] = []
    repartitions = 0
    for dp_rank, positions in enumerate(ranks_parts):
        rank_ids = [ids[p] for p in positions]
        if not rank_ids:
            continue
        tokens = sum(lengths[i] for i in rank_ids)
        m = max(1, -(-tokens // capacity))
        while True:
            parts = [[rank_ids[p] for p in part] for part in karmarkar_karp([work(i) for i in rank_ids], m) if part]
            if all(sum(lengths[i] for i in part) <= capacity for part in parts):
                break
            if m >= len(rank_ids):  # one sequence per part always fits (checked at parse time)
                raise InfeasibleError(f"DP rank {dp_rank}: a sequence exceeds the group capacity {capacity}")
            repartitions += 1
            m += 1
        ordered = _ends_light(parts, [sum(work(i) for i in part) for part in parts])
        group = par.cp_group(dp_rank)
        specs.extend(all_sharded(step=step, ranks=group, ids=part) for step, part in enumerate(ordered))
    return specs, repartitions


class VerlKkPlanner:
    """verl's Karmarkar-Karp balancing over DP ranks and microbatches, all sequences sharded."""

    name = "verl-kk"
    #: its ``solve.stats`` (repartitions) count over the whole request
    streams_iterations = False
    #: each DP rank's split set up per batch (64 ranks: 0.14 s for 8,192 sequences); 0.78 s for 8,192 ShareGPT
    #: sequences on Qwen2.5-7B at DP 4, 15.2 s for 16,384 at DP 2
    budget = Cost(0.002, 5e-6, per_rank_square_s=1.2e-7, per_rank_cube_s=8.6e-12, per_dp_rank_s=1.5e-3)

    def plan(self, problem: Problem) -> PlannerOutput:
        cache: dict[int, float] = {}
        iterations = []
        repartitions = 0
        for ids in problem.batch_ids:
            specs, extra = verl_kk_batch(problem, ids, flops=cache)
            iterations.append(tuple(specs))
            repartitions += extra
        return PlannerOutput(iterations=tuple(iterations), stats=(("token_cap_repartitions", float(repartitions)),))

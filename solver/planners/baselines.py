"""Baselines every user already runs: every sequence sharded over its DP rank's whole CP group.

* ``deepspeed``: DeepSpeed Ulysses / ZeRO-2 SFT with micro-batch size 1: the global batch in loader
  order, a contiguous equal share per DP rank (as a distributed sampler splits it), one sequence per
  microbatch.
* ``packed``: the same shares, packed in loader order into microbatches of at most ``cp * bucket_tokens``
  tokens (a new microbatch starts when the next sequence would overflow).
* ``sorted``: LongAlign's sorted batching (Bai et al. 2024, section 3.2): sort the global batch by length,
  cut it into groups of ``dp`` consecutive sequences (one microbatch step: DP rank r takes the r-th
  sequence of the group, so ranks of a step get similar lengths), shuffle the groups with the request's
  seed (and the iteration index), micro-batch size 1 as in the DeepSpeed runs it was compared in.
"""

from __future__ import annotations

import random

from skrull.solver.gathered import group_capacity_tokens
from skrull.solver.plan import MicrobatchSpec, Problem
from skrull.solver.planners.base import (
    Cost,
    PlannerOutput,
    all_sharded,
    contiguous_shares,
    iteration_seed,
    plan_each_iteration,
)


def deepspeed_batch(problem: Problem, _index: int, ids: tuple[int, ...]) -> list[MicrobatchSpec]:
    par = problem.parallel
    specs: list[MicrobatchSpec] = []
    for dp_rank, share in enumerate(contiguous_shares(ids, par.dp)):
        ranks = par.cp_group(dp_rank)
        specs.extend(all_sharded(step=step, ranks=ranks, ids=[i]) for step, i in enumerate(share))
    return specs


def packed_batch(problem: Problem, _index: int, ids: tuple[int, ...]) -> list[MicrobatchSpec]:
    par = problem.parallel
    capacity = group_capacity_tokens(problem)
    lengths = problem.lengths
    specs: list[MicrobatchSpec] = []
    for dp_rank, share in enumerate(contiguous_shares(ids, par.dp)):
        ranks = par.cp_group(dp_rank)
        packs: list[list[int]] = []
        tokens = capacity + 1  # forces a first pack
        for i in share:
            if tokens + lengths[i] > capacity:
                packs.append([])
                tokens = 0
            packs[-1].append(i)
            tokens += lengths[i]
        specs.extend(all_sharded(step=step, ranks=ranks, ids=pack) for step, pack in enumerate(packs))
    return specs


def sorted_batch(problem: Problem, index: int, ids: tuple[int, ...]) -> list[MicrobatchSpec]:
    par = problem.parallel
    lengths = problem.lengths
    ordered = sorted(ids, key=lambda i: (lengths[i], i))
    groups = [ordered[k : k + par.dp] for k in range(0, len(ordered), par.dp)]
    random.Random(iteration_seed(problem.seed, index)).shuffle(groups)
    specs: list[MicrobatchSpec] = []
    for step, group in enumerate(groups):
        for dp_rank, i in enumerate(group):
            specs.append(all_sharded(step=step, ranks=par.cp_group(dp_rank), ids=[i]))
    return specs


class DeepSpeedPlanner:
    name = "deepspeed"
    #: each batch is placed from that batch alone
    streams_iterations = True
    #: 1.2-1.8 us per sequence and CP rank at CP 1,024 (4,096 sequences: 5.2-7.5 s)
    budget = Cost(0.001, 20e-6, per_slot_s=1.6e-6)

    def plan(self, problem: Problem) -> PlannerOutput:
        return plan_each_iteration(problem, deepspeed_batch)


class PackedPlanner:
    name = "packed"
    #: each batch is placed from that batch alone
    streams_iterations = True
    #: 2.4-3.5 us a sequence measured in all (ShareGPT on Qwen2.5-7B: small microbatches)
    budget = Cost(0.001, 2e-6)

    def plan(self, problem: Problem) -> PlannerOutput:
        return plan_each_iteration(problem, packed_batch)


class SortedPlanner:
    name = "sorted"
    #: the shuffle is seeded with the iteration index
    streams_iterations = False
    #: as ``deepspeed``: one local list per GPU of every microbatch's group
    budget = DeepSpeedPlanner.budget

    def plan(self, problem: Problem) -> PlannerOutput:
        return plan_each_iteration(problem, sorted_batch)

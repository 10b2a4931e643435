"""``spread``: a constructive start for ``auto`` that uses flexible groups from the first step.

Per batch, with ``T`` the tight lower bound of the batch (``bound.tight_bound_ms``: what every GPU must
at least spend), longest sequences first:

* a sequence whose whole-GPU compute ``a*FLOPs(S)`` exceeds ``alpha * T``, or that exceeds the bucket,
  is sharded alone over the smallest aligned block (sizes dividing dp*cp) that holds it and brings
  ``a*FLOPs(S) / d`` under ``alpha * T``, on the least-loaded such block (groups wider than CP, as
  Megatron-Core's dynamic CP and Hydraulis's heterogeneous replicas do);
* every other sequence stays whole on one GPU, on the GPU whose load grows least (LPT, Graham 1969):
  into that GPU's open microbatch while it has room, else in a new one (one more microbatch_ms and
  compute.fixed_ms).

The best of a few ``alpha`` wins. About n * dp*cp operations, vectorised over the GPUs: a few ms for 256
sequences on 32 GPUs, about a second for 65,536 on 512.
The local search then merges, moves and regroups from there.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from skrull.solver.cost import CostModel
from skrull.solver.cp_modes import CP_MODES
from skrull.solver.plan import MicrobatchSpec, Problem
from skrull.solver.planners.base import PlannerOutput, make_spec
from skrull.solver.search.bound import tight_bound_ms
from skrull.solver.search.improve import blocks_by_size

#: Shares of the bound above which a sequence is sharded over a wider group.
ALPHAS = (0.35, 0.7)


class SpreadStart:
    """Planner protocol; used by ``auto`` as a start (module docstring)."""

    name = "spread"
    #: each batch is spread from that batch alone
    streams_iterations = True
    #: no planner of the registry: its work is counted in ``auto``'s (``AutoPlanner.budget``)
    budget = None
    #: priced in the request's modes (``choose_modes``), sharding only over groups one of them runs
    cp_modes = CP_MODES

    def plan(self, problem: Problem) -> PlannerOutput:
        cost = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens, choose_modes=problem.cp_modes)
        iterations = []
        for ids in problem.batch_ids:
            best: tuple[float, list[MicrobatchSpec]] | None = None
            for alpha in ALPHAS:
                specs, worst = spread_batch(problem, ids, cost, alpha)
                if best is None or worst < best[0]:
                    best = (worst, specs)
            iterations.append(tuple(best[1]) if best else ())
        return PlannerOutput(iterations=tuple(iterations))


def spread_batch(
    problem: Problem, ids: Sequence[int], cost: CostModel, alpha: float
) -> tuple[list[MicrobatchSpec], float]:
    """One batch's microbatches and its iteration time (the slowest GPU)."""
    lengths = problem.lengths
    gpus = problem.parallel.num_gpus
    bucket = cost.bucket_tokens
    profile = cost.profile
    ms_per_flop = profile.compute.ms_per_tflop / 1e12
    opening = profile.microbatch_ms + profile.compute.fixed_ms
    blocks = blocks_by_size(gpus)
    sizes = [d for d in sorted(blocks) if cost.shards_on(d)]  # with Ulysses alone: groups dividing the heads
    limit = alpha * tight_bound_ms([lengths[i] for i in ids], cost, problem.parallel)
    # the longest sequence a block of each size holds alone, with the gathered K/V of the mode that holds most
    holds = {d: max(cost.max_sequence_tokens(d, m) for m in cost.memory_modes(d)) for d in sizes if d > 1}
    # per-GPU state as arrays: each choice below is one vectorised pass over the GPUs (the first minimum,
    # as ``min`` over GPUs in index order picks it), n * G operations in C, not in the interpreter
    load = np.zeros(gpus)
    room = np.zeros(gpus, dtype=np.int64)  # tokens left in each GPU's open microbatch (0: none open)
    local: list[list[list[int]]] = [[] for _ in range(gpus)]  # per GPU, its microbatches
    wide: list[tuple[tuple[int, ...], int]] = []
    for i in sorted(ids, key=lambda k: -lengths[k]):
        s = lengths[i]
        flops_ms = ms_per_flop * cost.flops(s)
        if s > bucket or flops_ms > limit:
            d = next((d for d in sizes if d > 1 and s <= holds[d] and flops_ms / d <= limit), sizes[-1])
            # aligned blocks of d GPUs in order: the one whose busiest GPU ends soonest with this sequence
            # (with topology a block across nodes pays inter_node, so an equally loaded one inside a node wins)
            times = block_times(cost, blocks[d], s)
            at = int(np.argmin(load.reshape(-1, d).max(axis=1) + times))
            block = blocks[d][at]
            t = float(times[at] if len(times) > 1 else times[0])
            load[block[0] : block[-1] + 1] += t
            wide.append((block, i))
            continue
        fits = room >= s
        g = int(np.argmin(load + flops_ms + np.where(fits, 0.0, opening)))
        if fits[g]:
            local[g][-1].append(i)
            room[g] -= s
        else:
            local[g].append([i])
            room[g] = bucket - s
        load[g] += flops_ms + (0.0 if len(local[g][-1]) > 1 else opening)
    return _specs(wide, local, gpus), float(load.max()) if gpus else 0.0


def block_times(cost: CostModel, blocks: Sequence[tuple[int, ...]], num_tokens: int) -> np.ndarray:
    """Time of a microbatch sharding one sequence of ``num_tokens`` over each block: one figure without
    topology, else one per link, each block priced on the link its ranks use."""
    if cost.topology is None:
        return np.array([cost.microbatch_time_ms([[] for _ in blocks[0]], [num_tokens])])
    by_link: dict[str | None, float] = {}
    out = np.empty(len(blocks))
    for k, block in enumerate(blocks):
        link = cost.link_of(block)
        if link not in by_link:
            by_link[link] = cost.microbatch_time_ms([[] for _ in block], [num_tokens], link=link)
        out[k] = by_link[link]
    return out


def _specs(
    wide: Sequence[tuple[tuple[int, ...], int]], local: Sequence[Sequence[list[int]]], gpus: int
) -> list[MicrobatchSpec]:
    """Steps: wide microbatches first (each at the first step free on its GPUs), then each GPU's own."""
    next_step = [0] * gpus
    out = []
    for block, i in wide:
        step = max(next_step[g] for g in block)
        for g in block:
            next_step[g] = step + 1
        out.append(make_spec(step=step, ranks=block, local=[() for _ in block], sharded=[i]))
    for g, mbs in enumerate(local):
        for mb in mbs:
            out.append(make_spec(step=next_step[g], ranks=(g,), local=[mb], sharded=()))
            next_step[g] += 1
    return out

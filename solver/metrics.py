"""Figures of merit of a plan beyond its estimated time, shared by ``compare`` and the benchmarks.

* Imbalance degree (WLB-LLM sec. 7.4, Table 2): per iteration ``max_mb(time) * count / sum_mb(time)``
  over its microbatches (1.0 is perfectly even); WLB-LLM writes it ``Max_Latency x PP_size /
  Total_Latency`` with the PP microbatches of one batch. Averaged over the iterations that run anything.
* Peak bucket use: the fullest GPU of any microbatch, ``(sum local + sum sharded / N) / bucket_tokens``
  (eq. 7), as a fraction (<= 1 for every valid plan).
* Synchronized makespan: the specification prices an iteration as the max over GPUs of their summed
  microbatch times (eq. 8). When groups change from step to step (dynamic CP) a microbatch can only
  start when every GPU of its group has finished its earlier steps, so the real critical path can be
  longer; this replays the plan in step order with that rule. It equals the specification's figure whenever
  groups never straddle (every static DP x CP plan).
* Tokens run: tokens of the sequences placed in iterations (not ``pending``).
* Delay (WLB-LLM sec. 7.5, "0.5 iterations per token"): iterations between a sequence's own batch and the
  iteration that runs it, token-weighted; a pending sequence counts as run just after the last iteration
  (a lower bound). The same figure for every planner that moves work later (``wlb``'s queues, ``auto``'s
  ``defer``).
* Work: the plan-independent cost of the sequences a plan runs, the average term of the specification's lower
  bound summed per sequence, ``sum_S [ms_per_tflop * FLOPs(S) / 1e12 + microbatch_ms * S / bucket] / (dp*cp)``
  (additive over sequences, unlike the bound's ``max`` with the longest sequence). Time per work compares
  plans that run different sequences in an iteration, or defer some past the request, fairly.
"""

from __future__ import annotations

from collections.abc import Sequence

from skrull.solver.cost import CostModel
from skrull.solver.plan import Iteration, Plan
from skrull.solver.sharding import position_token_counts


def iteration_imbalance(iteration: Iteration) -> float | None:
    """``max * count / total`` of the iteration's microbatch times; None when it runs nothing."""
    times = [mb.estimated_ms for mb in iteration.microbatches]
    total = sum(times)
    if not times or total <= 0:
        return None
    return max(times) * len(times) / total


def imbalance_degree(plan: Plan) -> float | None:
    """Mean over iterations of ``iteration_imbalance``; None for a plan that runs nothing."""
    values = [v for v in (iteration_imbalance(it) for it in plan.iterations) if v is not None]
    return sum(values) / len(values) if values else None


def peak_bucket_use(plan: Plan, lengths: Sequence[int]) -> float:
    """Largest per-GPU token load of any microbatch (real tokens: local sequences plus the pieces the
    microbatch's sharding cuts for the GPU), as a fraction of ``bucket_tokens``."""
    peak = 0
    for it in plan.iterations:
        for mb in it.microbatches:
            pieces = position_token_counts(mb.sharding, [lengths[i] for i in mb.sharded], len(mb.ranks))
            for ids, piece in zip(mb.local, pieces, strict=True):
                peak = max(peak, sum(lengths[i] for i in ids) + piece)
    return peak / plan.bucket_tokens


def synchronized_iteration_ms(iteration: Iteration, num_gpus: int) -> float:
    """Critical path of one iteration when a microbatch waits for every GPU of its group."""
    free_at = [0.0] * num_gpus
    for mb in sorted(iteration.microbatches, key=lambda m: m.step):
        start = max(free_at[g] for g in mb.ranks)
        end = start + mb.estimated_ms
        for g in mb.ranks:
            free_at[g] = end
    return max(free_at, default=0.0)


def synchronized_makespan_ms(plan: Plan) -> float:
    """Summed critical paths of all iterations (>= ``plan.estimated_ms``)."""
    return sum(synchronized_iteration_ms(it, plan.parallel.num_gpus) for it in plan.iterations)


def tokens_run(plan: Plan, lengths: Sequence[int]) -> int:
    return sum(lengths[i] for it in plan.iterations for mb in it.microbatches for i in mb.seq_ids)


def delay_iterations(plan: Plan, batch_sizes: Sequence[int], lengths: Sequence[int]) -> float:
    """Token-weighted mean delay in iterations (module docstring); sequence ids run batch after batch."""
    batch_of = [b for b, size in enumerate(batch_sizes) for _ in range(size)]
    ran = {i: k for k, it in enumerate(plan.iterations) for mb in it.microbatches for i in mb.seq_ids}
    ran.update((i, len(batch_sizes)) for i in plan.pending)
    tokens = sum(lengths[i] for i in ran)
    return sum((k - batch_of[i]) * lengths[i] for i, k in ran.items()) / tokens if tokens else 0.0


def work_ms(plan: Plan, lengths: Sequence[int], model: CostModel) -> float:
    """Summed per-sequence work of everything the plan runs (module docstring)."""
    coefficients = model.coefficients
    total = sum(
        coefficients.work_ms(lengths[i]) for it in plan.iterations for mb in it.microbatches for i in mb.seq_ids
    )
    return total / plan.parallel.num_gpus

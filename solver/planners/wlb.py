"""``wlb``: WLB-LLM's workload-aware variable-length packing with outlier delay, and its adaptive CP
sharding (Wang et al., "WLB-LLM: Workload-Balanced 4D Parallelism for LLM Training", secs. 4-5).

What was checked: WLB-LLM's packing and outlier delay have no public code; they follow the
paper's text and Alg. 1. Its public code covers only the per-document CP attention; the cuts in
``solver/sharding.py`` follow the paper's sec. 5.1 and were not compared with that code. Departures,
each a choice of this project: the workload is the reference model's (WLB profiles W_a and W_l
offline), the microbatch count and the queue thresholds are searched per request (WLB takes them from
its configuration and an offline tuning), and the kernel-time model for the sharding choice is
``solver.attention_model`` rather than WLB's profiled kernel curves.

Packing (sec. 4, Alg. 1), per global batch, into M = ``dp * m`` microbatches:

* Workload of a document of d tokens (eq. 2): ``W(d) = W_a(d) + W_l(d)``, attention (quadratic) plus
  everything linear (GEMMs, the CP all-gather, element-wise), from the profile under the layout WLB uses,
  every document sharded over the CP group of N GPUs:
  ``W_a(d) = ms_per_tflop * flops_per_token_sq * d^2 / 1e12 / N`` and
  ``W_l(d) = ms_per_tflop * flops_per_token * d / 1e12 / N + comm_ms_per_token * d`` (comm only if N > 1).
  A microbatch's workload is the sum over its documents; the fixed costs are the same for every
  microbatch and do not enter. Length cap ``S_max = cp * bucket_tokens`` (memory, eq. 7).
* Outlier delay (sec. 4.2): n queues with thresholds ``L_1 < ... < L_n``; a document with
  ``L_i <= d < L_{i+1}`` (``L_{n+1} = inf``) waits in queue i (FIFO). When a queue holds M documents, M of
  them are popped into this iteration, so each microbatch gets one.
* Greedy (sec. 4.3): the documents left over from the previous iteration first (FIFO), then this
  iteration's regular documents and popped outliers in descending workload (LPT order, so the popped
  outliers, the heaviest, land one per microbatch). Each goes to the least-workload microbatch if it fits
  ``S_max``, else to the shortest microbatch if it fits there, else it waits for the next iteration.
* After the request's last batch, whatever still waits (queues and leftovers) is ``pending``.
* Delay (sec. 7.5 reports 0.5 iterations per token): iterations between a sequence's own batch and the
  one that runs it; pending sequences count as delayed to just after the last iteration (a lower bound).
  ``solve.stats`` reports the token-weighted mean (``avg_delay_iterations``) and the per-sequence mean.

Choices where the paper leaves a knob to the user (written down, deterministic):

* The microbatch count: WLB takes it from the training configuration (PP x DP). A request carries none,
  so ``m`` per DP rank is swept over ``m0 .. m0+2`` with ``m0 = ceil(mean batch tokens / (dp * S_max))``.
* The thresholds: WLB tunes ``L_i`` on a sample of the data, maximizing balance while keeping the
  per-token delay low (sec. 4.2). Here the sample is the request: ``L_1`` is the shortest length whose
  workload reaches ``alpha`` times a balanced microbatch's workload (``mean batch workload / M``), for
  ``alpha`` in (0.25, 0.5, 1.0), and ``L_{i+1}`` doubles that workload; "no queues" is a candidate too.
  Among the (alpha, m) candidates whose token-weighted delay stays within ``max_token_delay`` (0.5, the
  paper's figure), the one with the lowest estimated time per unit of the work it runs
  (``solver.metrics.work_ms``: deferring work cannot win by itself) wins; ties go to fewer queues, then
  fewer microbatches. Explicit ``thresholds`` / ``microbatches_per_rank`` skip the search.
* Microbatch k runs on DP rank ``k mod dp`` at step ``k div dp`` (empty ones dropped): the microbatches
  are balanced, so any fixed assignment is.

Adaptive CP sharding (sec. 5): every microbatch with more than one GPU per group is cut either
per-sequence (the packed buffer, zigzag) or per-document (each document in 2N chunks, remainder dealt
round-robin; ``solver/sharding.py``), whichever ``solver.attention_model`` predicts faster for the slowest
position (ties: per-sequence). The reference model prices both alike (it charges ``FLOPs / N`` per GPU);
the choice is recorded in the plan (``sharding``) and drives the worker view.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from skrull.solver.attention_model import AttentionKernelModel
from skrull.solver.cost import CostModel
from skrull.solver.gathered import group_capacity_tokens
from skrull.solver.plan import MicrobatchSpec, Problem
from skrull.solver.planners.base import Cost, PlannerOutput, make_spec
from skrull.solver.sharding import per_document_layout, per_sequence_layout

PENDING = -1
#: Candidate first thresholds, as fractions of a balanced microbatch's workload (module docstring).
ALPHAS: tuple[float, ...] = (0.25, 0.5, 1.0)
#: Microbatch counts per DP rank tried from the memory minimum ``m0`` upward.
MICROBATCH_SWEEP = 3
#: Token-weighted delay a candidate may cause, in iterations: the paper's reported figure (sec. 7.5).
MAX_TOKEN_DELAY = 0.5
#: Delays within this of the limit count as within it (float noise of a weighted mean).
DELAY_TOLERANCE = 1e-12


@dataclass(frozen=True, slots=True, kw_only=True)
class WlbPacking:
    """Microbatches (id tuples) per iteration; ``placed_in[i]`` is the iteration running sequence i, or
    ``PENDING``; ``pending`` in queue/leftover order."""

    iterations: tuple[tuple[tuple[int, ...], ...], ...]
    placed_in: tuple[int, ...]
    pending: tuple[int, ...]


def document_workload(problem: Problem) -> Callable[[int], float]:
    """``W(d) = W_a(d) + W_l(d)`` in ms for a document sharded over the CP group (eq. 2): the cost
    model's ``sharded_ms(d, cp)`` (``solver.cost.CostCoefficients.sharded_terms``)."""
    coefficients = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens).coefficients
    group_size = problem.parallel.cp

    def workload(d: int) -> float:
        return coefficients.sharded_ms(d, group_size)

    return workload


def wlb_pack(
    *,
    lengths: Sequence[int],
    batch_ids: Sequence[Sequence[int]],
    num_microbatches: int,
    s_max: int,
    workload: Callable[[int], float],
    thresholds: Sequence[int],
) -> WlbPacking:
    """WLB-LLM Alg. 1 over the request's batches (see the module docstring)."""
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches must be >= 1, got {num_microbatches}")
    limits = sorted(thresholds)
    queues: list[list[int]] = [[] for _ in limits]
    leftovers: list[int] = []
    placed_in = [PENDING] * len(lengths)
    iterations: list[tuple[tuple[int, ...], ...]] = []
    m = num_microbatches
    for index, ids in enumerate(batch_ids):
        regular: list[int] = []
        for i in ids:
            q = sum(1 for limit in limits if lengths[i] >= limit) - 1
            if q >= 0:
                queues[q].append(i)
            else:
                regular.append(i)
        for queue in queues:
            if len(queue) >= m:
                regular.extend(queue[:m])
                del queue[:m]
        docs = leftovers + sorted(regular, key=lambda i: (-workload(lengths[i]), i))
        loads = [0.0] * m
        tokens = [0] * m
        members: list[list[int]] = [[] for _ in range(m)]
        leftovers = []
        for i in docs:
            s = lengths[i]
            j = min(range(m), key=loads.__getitem__)
            if tokens[j] + s > s_max:
                j = min(range(m), key=tokens.__getitem__)
                if tokens[j] + s > s_max:
                    leftovers.append(i)
                    continue
            members[j].append(i)
            loads[j] += workload(s)
            tokens[j] += s
            placed_in[i] = index
        iterations.append(tuple(tuple(mb) for mb in members))
    pending = tuple(leftovers) + tuple(i for queue in queues for i in queue)
    return WlbPacking(iterations=tuple(iterations), placed_in=tuple(placed_in), pending=pending)


def delay_stats(packing: WlbPacking, lengths: Sequence[int], batch_ids: Sequence[Sequence[int]]) -> dict[str, float]:
    """Token-weighted and per-sequence mean delay in iterations (pending: to just past the last one)."""
    num_batches = len(batch_ids)
    total_tokens = 0
    token_delay = 0
    seq_delay = 0
    delayed = 0
    count = 0
    for b, ids in enumerate(batch_ids):
        for i in ids:
            ran = packing.placed_in[i]
            delay = (num_batches if ran == PENDING else ran) - b
            total_tokens += lengths[i]
            token_delay += delay * lengths[i]
            seq_delay += delay
            delayed += delay > 0
            count += 1
    return {
        "avg_delay_iterations": token_delay / total_tokens if total_tokens else 0.0,
        "avg_delay_sequences": seq_delay / count if count else 0.0,
        "delayed_sequences": float(delayed),
        "pending_sequences": float(len(packing.pending)),
    }


def thresholds_for(
    alpha: float, *, num_queues: int, workload: Callable[[int], float], target: float, s_max: int
) -> tuple[int, ...]:
    """``L_i``: the shortest lengths whose workload reaches ``alpha * 2^(i-1) * target`` (<= S_max)."""
    out: list[int] = []
    for q in range(num_queues):
        goal = alpha * target * 2**q
        if workload(s_max) < goal:
            break
        lo, hi = 1, s_max
        while lo < hi:
            mid = (lo + hi) // 2
            if workload(mid) >= goal:
                hi = mid
            else:
                lo = mid + 1
        if out and lo <= out[-1]:
            lo = out[-1] + 1
        if lo > s_max:
            break
        out.append(lo)
    return tuple(out)


def choose_sharding(lengths: Sequence[int], group_size: int, kernel: AttentionKernelModel) -> tuple[str, float, float]:
    """WLB-LLM sec. 5.3: the mode whose slowest position is predicted faster (ties: per-sequence).
    Returns (mode, predicted per-sequence ms, predicted per-document ms)."""
    predicted = []
    for cut in (per_sequence_layout, per_document_layout):
        ranges = cut(lengths, group_size)
        predicted.append(kernel.slowest_position_ms(ranges, group_size))
    per_seq, per_doc = predicted
    return ("per-document" if per_doc < per_seq else "per-sequence"), per_seq, per_doc


#: ``auto``'s start ``wlb-keep`` (search/starts.py): WLB-LLM without the outlier queues (no queue search; about
#: 0.8 of ``wlb``'s need); ``solver.budget.START_COSTS``.
KEEP_BUDGET = Cost(0.005, 7e-5, per_square_s=7.4e-9, per_slot_s=1.3e-5, per_gpu_s=1.4e-7)


class WlbPlanner:
    """WLB-LLM variable-length packing with multi-level outlier queues and adaptive CP sharding."""

    name = "wlb"
    #: outlier queues carry sequences across batches
    streams_iterations = False
    #: WLB-LLM 2.5-4x its earlier fit (pricing both CP modes, tight buckets): 7.2 s for 16,384 ShareGPT sequences
    budget = Cost(0.005, 9e-5, per_square_s=9e-9, per_slot_s=1.7e-5, per_gpu_s=1.8e-7)

    def __init__(
        self,
        *,
        num_queues: int = 2,
        thresholds: Sequence[int] | None = None,
        microbatches_per_rank: int | None = None,
        max_token_delay: float = MAX_TOKEN_DELAY,
        adaptive_sharding: bool = True,
    ) -> None:
        if num_queues < 0:
            raise ValueError(f"num_queues must be >= 0, got {num_queues}")
        self.num_queues = num_queues
        self.thresholds = None if thresholds is None else tuple(sorted(thresholds))
        self.microbatches_per_rank = microbatches_per_rank
        self.max_token_delay = max_token_delay
        self.adaptive_sharding = adaptive_sharding

    def plan(self, problem: Problem) -> PlannerOutput:
        lengths = problem.lengths
        par = problem.parallel
        s_max = group_capacity_tokens(problem)
        workload = document_workload(problem)
        model = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens)
        mean_tokens = sum(lengths) / max(1, len(problem.batch_ids))
        m0 = max(1, -(-int(mean_tokens) // (par.dp * s_max)))
        ms = (
            [self.microbatches_per_rank]
            if self.microbatches_per_rank is not None
            else list(range(m0, m0 + MICROBATCH_SWEEP))
        )
        mean_work = sum(workload(s) for s in lengths) / max(1, len(problem.batch_ids))

        best: tuple[tuple[int, float, int, int], WlbPacking, int, tuple[int, ...]] | None = None
        for m in ms:
            num_mb = par.dp * m
            if self.thresholds is not None:
                candidates = [self.thresholds]
            else:
                target = mean_work / num_mb
                candidates = [()] + [
                    thresholds_for(a, num_queues=self.num_queues, workload=workload, target=target, s_max=s_max)
                    for a in ALPHAS
                ]
            for limits in dict.fromkeys(candidates):
                packing = wlb_pack(
                    lengths=lengths,
                    batch_ids=problem.batch_ids,
                    num_microbatches=num_mb,
                    s_max=s_max,
                    workload=workload,
                    thresholds=limits,
                )
                delay = delay_stats(packing, lengths, problem.batch_ids)["avg_delay_iterations"]
                ratio = _efficiency(packing, problem, model, m)
                over = 0 if delay <= self.max_token_delay + DELAY_TOLERANCE else 1
                key = (over, ratio if not over else delay, len(limits), m)
                if best is None or key < best[0]:
                    best = (key, packing, m, limits)
        assert best is not None
        _, packing, m, limits = best
        kernel = AttentionKernelModel(problem.profile)
        iterations = []
        modes = {"per-sequence": 0, "per-document": 0}
        for mbs in packing.iterations:
            specs = []
            for spec in _to_specs(mbs, problem, m):
                if self.adaptive_sharding and len(spec.ranks) > 1 and spec.sharded:
                    mode, _, _ = choose_sharding([lengths[i] for i in spec.sharded], len(spec.ranks), kernel)
                    modes[mode] += 1
                    spec = make_spec(
                        step=spec.step, ranks=spec.ranks, local=spec.local, sharded=spec.sharded, sharding=mode
                    )
                specs.append(spec)
            iterations.append(tuple(specs))
        stats = delay_stats(packing, lengths, problem.batch_ids)
        stats["microbatches_per_rank"] = float(m)
        stats["queues"] = float(len(limits))
        for q, limit in enumerate(limits):
            stats[f"threshold_{q + 1}_tokens"] = float(limit)
        stats["per_sequence_microbatches"] = float(modes["per-sequence"])
        stats["per_document_microbatches"] = float(modes["per-document"])
        return PlannerOutput(iterations=tuple(iterations), pending=packing.pending, stats=tuple(stats.items()))


def _to_specs(microbatches: Sequence[Sequence[int]], problem: Problem, m: int) -> list[MicrobatchSpec]:
    """Microbatch k on DP rank ``k mod dp``, all sequences sharded over its CP group; steps renumbered."""
    par = problem.parallel
    next_step = [0] * par.dp
    specs = []
    for k, ids in enumerate(microbatches):
        if not ids:
            continue
        dp_rank = k % par.dp
        group = par.cp_group(dp_rank)
        specs.append(make_spec(step=next_step[dp_rank], ranks=group, local=[() for _ in group], sharded=ids))
        next_step[dp_rank] += 1
    return specs


def _efficiency(packing: WlbPacking, problem: Problem, model: CostModel, m: int) -> float:
    """Summed iteration estimates per unit of the work they run (``solver.metrics.work_ms``)."""
    lengths = problem.lengths
    coefficients = model.coefficients
    total_ms = 0.0
    work = 0.0
    for mbs in packing.iterations:
        specs = _to_specs(mbs, problem, m)
        total_ms += model.iteration_ms(specs, lengths, problem.parallel.num_gpus)
        work += sum(coefficients.work_ms(lengths[i]) for s in specs for i in s.seq_ids)
    return total_ms / work if work > 0 else float("inf")

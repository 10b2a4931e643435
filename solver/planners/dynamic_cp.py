"""``dynamic-cp``: Megatron-Core dynamic context parallelism (NVIDIA blog "Dynamic Context Parallelism",
and the public synchronous scheduler; facts only).

Per global batch, every microbatch step partitions the ``G = dp * cp`` GPUs into CP groups whose sizes
are powers of two up to G, each an *aligned contiguous block* (a group of size c starts at a multiple of
c; such groups are pre-created at start-up, so no group is built at run time). A sequence listed on k
ranks runs with CP = k; each GPU takes part in exactly one group per step.

What was checked against the public code, and where this planner departs from it. Checked: Megatron-
Core's ``BalancedCPScheduler`` (the hybrid DP x CP scheduler of its data path, 2025) and the blog. The
public scheduler prices a sequence at ``L^2 / cp``, gives it ``cp = max(1, 2^ceil(log2(L /
max_seq_len_per_rank)))``, fills one microbatch by placing each sequence in the least-loaded existing
group of its size or on free GPUs, closes the microbatch once the per-GPU loads are within a 5% slack
(``delta``) or nothing else fits, trims the last sequence of the most-loaded group while that reduces
the slack, and fills idle GPUs by doubling the smallest groups into consecutive ranks. Departures, each a
choice of this project: (a) the per-step *workload quota* ``total work / (G * m) * (1 + delta)`` that
makes a sequence wait (and, with ``workload_cp``, widens heavy sequences) is the blog's description, not
the public scheduler, which uses the slack test and the trim; (b) the *sweep over the step count m* is
the blog's small grid search, not in the public scheduler, which has no m; (c) the default work is the
reference model's FLOPs, the public ``L^2 / cp`` is ``workload="l2"``; (d) the public scheduler first
cuts the sorted sequences into work-balanced buckets, one per CP size, which is not modelled here.

Decision logic, as implemented:

1. Each sequence gets the CP size ``c(S) = 2^ceil(log2(S / bucket_tokens))`` (at least 1): the fewest
   GPUs whose memory holds it. The blog adds the workload side ("if a sample's workload exceeds the
   microbatch workload quota, it is given a larger CP size"): with ``workload_cp`` (the default) c is
   doubled until ``work(S) / c`` is within the per-GPU quota of a step (or c is the whole cluster);
   ``workload_cp=False`` is the public scheduler's memory-only rule.
2. Sequences are taken in descending length. Each goes to the least-loaded group of its size that still
   has room (``sum(S) <= c * bucket_tokens`` in the group, eq. 7), a fresh aligned block of free GPUs
   counting as load 0, so new blocks are opened before groups are stacked. A sequence that would push an
   already loaded group past the step's per-GPU quota (``total work / (G * m)`` times ``1 + delta``), or
   that finds no room, waits for the next step, in the same order.
3. When a step closes, GPUs left idle are filled by widening the smallest groups (least loaded first):
   a group of size c becomes an aligned block of size 2c, its own buddy block if the rest of it is idle,
   else the lowest wholly idle one (groups are rebuilt every step, so moving costs nothing), and its
   sequences are then sharded over 2c GPUs; repeatedly, until no group can widen.
4. The number of steps m (microbatches per GPU) is chosen by a small sweep, the blog's replacement for
   an exhaustive search: ``m0 = ceil(sum(S) / (G * bucket_tokens))`` (the fewest that memory allows)
   up to ``m0 + sweep - 1``; the plan with the lowest estimated iteration time under the reference model
   wins (ties: fewer steps). The last step of a candidate takes no quota; sequences still left open
   extra steps, so every candidate is complete.

Work of a sequence on c GPUs: ``FLOPs(S) / c`` per GPU from the profile (``workload="flops"``). The
public scheduler uses ``S^2 / c`` (``workload="l2"``), which is kept as an option: with it short
sequences look free and pile onto few GPUs; the blog's own profiled cost model is not public.

Choices where the sources are silent, written down: a layout whose G is not a power of two also has the
whole-cluster group (size G), so a sequence needing more than the largest power of two can still run
(Megatron itself requires powers of two); widening goes to the next allowed size; ties go to the lowest
rank. ``solve.stats`` reports ``makespan_ms``: the critical path when each microbatch waits for every GPU
of its group (``solver.metrics``), which the reference per-GPU sum (eq. 8) does not see.
"""

from __future__ import annotations

import bisect
import functools
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from math import inf

from skrull.solver.cost import CostModel
from skrull.solver.errors import InfeasibleError
from skrull.solver.metrics import synchronized_iteration_ms
from skrull.solver.plan import MicrobatchSpec, Parallel, Problem
from skrull.solver.planners.base import TIE_MS, Cost, PlannerOutput, make_spec


def allowed_sizes(num_gpus: int) -> tuple[int, ...]:
    """Powers of two up to ``num_gpus``, plus ``num_gpus`` itself when it is not one."""
    sizes = []
    c = 1
    while c <= num_gpus:
        sizes.append(c)
        c *= 2
    if sizes[-1] != num_gpus:
        sizes.append(num_gpus)
    return tuple(sizes)


def block_start(gpu: int, size: int, num_gpus: int) -> int | None:
    """Start of the aligned block of ``size`` holding ``gpu``, or None if it would run past the cluster."""
    if size == num_gpus:
        return 0
    start = gpu - gpu % size
    return start if start + size <= num_gpus else None


def cp_size_for(num_tokens: int, bucket_tokens: int, sizes: Sequence[int], caps: dict[int, int] | None = None) -> int:
    """Smallest allowed size c with ``num_tokens <= c * bucket_tokens`` (``2^ceil(log2(S / C))``); with
    ``caps``, ``num_tokens <= caps[c]``, the most a group of c holds with its gathered K/V
    (``CostModel.max_sequence_tokens``)."""
    for c in sizes:
        if num_tokens <= (c * bucket_tokens if caps is None else caps[c]):
            return c
    raise InfeasibleError(
        f"{num_tokens} tokens fit no group of at most {sizes[-1]} GPUs in the modes this planner runs "
        "(with the gathered K/V an all-gather group keeps)"
    )


@dataclass(slots=True)
class _Group:
    start: int
    size: int
    ids: list[int] = field(default_factory=list)
    tokens: int = 0
    work: float = 0.0  # summed work of its sequences (per-GPU load is work / size)
    order: int = 0  # when it opened within its step (ties between equal loads go to the first)
    version: int = 0  # how many sequences it took: its valid entry in ``_fill_step``'s heap

    @property
    def load(self) -> float:
        return self.work / self.size


def _fill_step(
    pending: list[int],
    *,
    lengths: Sequence[int],
    need: dict[int, int],
    work: Callable[[int], float],
    num_gpus: int,
    bucket_tokens: int,
    quota: float | None,
    caps: dict[int, int] | None = None,
) -> tuple[list[_Group], list[int]]:
    """Place what fits into one step (``pending`` is in descending length); return groups and leftovers.

    Each sequence joins the least-loaded open group of its size ``c`` with room, unless the lowest wholly
    idle aligned block of ``c`` GPUs is free (then a new group opens there); past ``quota`` it waits for a
    later step. GPUs are only ever taken within a step, so a block found busy stays busy: the search for an
    idle block resumes, per size, where it last stopped, and the open groups are kept per size in a heap by
    load (ties to the first opened, as the scan had it): the least-loaded with room is the first popped
    that has room. The same placement as scanning every GPU and group for every sequence
    (tests/solver/planners/test_dynamic_cp.py checks both agree), without the quadratic cost that made
    this peer miss ``auto``'s start phase (61 ms for 128 sequences on 64 GPUs; the scan over a size's open
    groups still took 10 of 17 ms for 256 sequences on 64 GPUs, where the peers' child must also fit
    ``hydraulis`` in ``auto``'s 0.1 s start phase).
    """
    owner: list[_Group | None] = [None] * num_gpus
    groups: list[_Group] = []
    # per size, the open groups with room in a heap of (load, opening order, version, group): the least loaded
    # first, ties to the first opened (an entry whose version is not its group's is stale: the group took a
    # sequence since); those found without room for a sequence wait in a heap by room, most first, and come
    # back once a sequence fits them (a shorter one later, ``pending`` being in descending length), so a full group is
    # not popped again for every shorter sequence (in a tight bucket most are full: that made it slower
    # than the scan)
    by_size: dict[int, list[tuple[float, int, int, _Group]]] = {}
    full_by_size: dict[int, list[tuple[int, int, _Group]]] = {}
    next_start: dict[int, int] = {}  # per size: no idle aligned block starts below it
    left: list[int] = []
    k, count = 0, len(pending)
    while k < count:
        i = pending[k]
        k += 1
        s = lengths[i]
        c = need[i]
        cap = c * bucket_tokens if caps is None else caps[c]  # a group's sharded tokens (eq. 7, gathered K/V)
        best: _Group | None = None
        best_load = float("inf")
        heap = by_size.setdefault(c, [])
        full = full_by_size.setdefault(c, [])
        while full and -full[0][0] >= s:  # room again for this one
            _, _, g = heapq.heappop(full)
            heapq.heappush(heap, (g.load, g.order, g.version, g))
        while heap:
            load, order, version, g = heap[0]
            if version != g.version:
                heapq.heappop(heap)
            elif g.tokens + s > cap:
                heapq.heappop(heap)
                heapq.heappush(full, (g.tokens - cap, order, g))
            else:
                best, best_load = g, load
                break
        fresh = None
        if best_load > 0.0:
            step = c if c != num_gpus else num_gpus
            start = next_start.get(c, 0)
            while start <= num_gpus - c and any(owner[x] is not None for x in range(start, start + c)):
                start += step
            next_start[c] = start
            if start <= num_gpus - c:
                fresh = start
        if fresh is not None:
            best = _Group(start=fresh, size=c)
            best_load = 0.0
        # a sequence left here has no idle block of its size (searched above): the sequences after it of the same
        # size that are as surely left (longer than any group's room; or more work than the quota allows the
        # least-loaded group) are skipped at once. Without that, a step ran over every pending sequence and a
        # rank of 16,384 short sequences in a tight bucket (1,327 steps) took 26 s
        if best is None:
            left.append(i)
            room = -full[0][0] if full else 0  # every group of this size is in ``full`` now
            too_long = functools.partial(_longer_than, lengths=lengths, room=room)
            k = _skip_run(pending, k, left, too_long, need=need, size=c)
            continue
        if quota is not None and best_load > 0.0 and best_load + work(s) / c > quota:
            left.append(i)
            # stale entries hold a live group too: no harm
            least = min(min((e[3].load for e in heap), default=inf), min((e[2].load for e in full), default=inf))
            if least > 0.0:
                # the test above with the least load of the size: it fails wherever that one does (rounding
                # is monotone), so the skip places as the scan would
                over = functools.partial(_over_quota, lengths=lengths, work=work, least=least, size=c, quota=quota)
                k = _skip_run(pending, k, left, over, need=need, size=c)
            continue
        if fresh is not None:
            best.order = len(groups)
            groups.append(best)
            for x in range(best.start, best.start + c):
                owner[x] = best
        best.ids.append(i)
        best.tokens += s
        best.work += work(s)
        best.version += 1
        heapq.heappush(heap, (best.load, best.order, best.version, best))
    _widen(groups, owner, num_gpus)
    return groups, left


def _longer_than(j: int, *, lengths: Sequence[int], room: int) -> bool:
    return lengths[j] > room


def _over_quota(
    j: int, *, lengths: Sequence[int], work: Callable[[int], float], least: float, size: int, quota: float
) -> bool:
    return least + work(lengths[j]) / size > quota


def _skip_run(
    pending: list[int], k: int, left: list[int], fails: Callable[[int], bool], *, need: dict[int, int], size: int
) -> int:
    """Move to ``left`` the sequences from ``pending[k]`` on that need ``size`` GPUs and ``fails``; return the
    index of the first one that does not. ``pending`` is in descending length and a sequence's size and work
    grow with its length, so both tests hold on a prefix of what follows: found by bisection."""
    end = bisect.bisect_left(pending, True, lo=k, key=lambda j: need[j] != size or not fails(j))
    left.extend(pending[k:end])
    return end


def _widen(groups: list[_Group], owner: list[_Group | None], num_gpus: int) -> None:
    """Widen the smallest groups into idle GPUs until none can widen.

    A group of size c grows to the next allowed size: into its aligned buddy block if the rest of that
    block is idle, else into the lowest wholly idle aligned block of that size (groups are rebuilt every
    step, so moving one costs nothing).
    """
    sizes = allowed_sizes(num_gpus)
    while any(o is None for o in owner):
        for g in sorted(groups, key=lambda g: (g.size, g.load, g.start)):
            bigger = [c for c in sizes if c > g.size]
            if not bigger:
                continue
            size = bigger[0]
            target = None
            own = block_start(g.start, size, num_gpus)
            if own is not None and all(owner[x] is None or owner[x] is g for x in range(own, own + size)):
                target = own
            else:
                step = size if size != num_gpus else num_gpus
                for start in range(0, num_gpus - size + 1, step):
                    if all(owner[x] is None for x in range(start, start + size)):
                        target = start
                        break
            if target is None:
                continue
            for x in range(g.start, g.start + g.size):
                owner[x] = None
            g.start, g.size = target, size
            for x in range(target, target + size):
                owner[x] = g
            break
        else:
            return


#: Step counts tried from the memory minimum upward (the blog's small grid search around the knee).
STEP_SWEEP = 3
#: Slack over an even share of work a step may take: the public scheduler's balance slack (5%).
BALANCE_SLACK = 0.05


class DynamicCpPlanner:
    """Megatron-Core dynamic CP: power-of-two aligned groups per step, widened to fill idle GPUs."""

    name = "dynamic-cp"
    #: its ``solve.stats`` (makespan) sum over the whole request
    streams_iterations = False
    #: its step filling kept in heaps, with the sequences sure to wait skipped (0.6 s for 16,384 ShareGPT
    #: sequences on one DP rank, 26.7 s before); a little per batch and DP rank (64 batches: 0.5 s)
    budget = Cost(0.005, 2e-5, per_square_s=1.5e-9, per_gpu_s=8e-8, per_dp_rank_s=5e-4)

    def __init__(
        self,
        *,
        sweep: int = STEP_SWEEP,
        delta: float = BALANCE_SLACK,
        workload: str = "flops",
        workload_cp: bool = True,
    ) -> None:
        if workload not in ("flops", "l2"):
            raise ValueError(f"workload must be 'flops' or 'l2', got {workload!r}")
        self.sweep = sweep
        self.delta = delta
        self.workload = workload
        self.workload_cp = workload_cp

    def plan(self, problem: Problem) -> PlannerOutput:
        model = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens)
        iterations = []
        makespan = 0.0
        for ids in problem.batch_ids:
            specs, sync_ms = self.plan_batch(problem, ids, model)
            iterations.append(tuple(specs))
            makespan += sync_ms
        return PlannerOutput(iterations=tuple(iterations), stats=(("makespan_ms", makespan),))

    def plan_batch(self, problem: Problem, ids: Sequence[int], model: CostModel) -> tuple[list[MicrobatchSpec], float]:
        """The best of the swept step counts, with its synchronized makespan."""
        lengths = problem.lengths
        num_gpus = problem.parallel.num_gpus
        bucket = problem.bucket_tokens
        sizes = allowed_sizes(num_gpus)
        # with the gathered K/V, the most each size holds (every sequence is sharded over its group) in the
        # mode of its view that holds most (Ulysses keeps no gathered K/V; the modes are assigned after)
        caps = None
        if model.gathered_kv_ratio:
            caps = {c: model.max_sequence_tokens_in(c, problem.cp_modes) for c in sizes}
        memory_need = {i: cp_size_for(lengths[i], bucket, sizes, caps) for i in ids}
        if self.workload == "flops":
            work: Callable[[int], float] = model.flops
        else:

            def work(s: int) -> float:
                return float(s) * s

        order = sorted(ids, key=lambda i: (-lengths[i], i))
        total_work = sum(work(lengths[i]) for i in ids)
        m0 = max(1, -(-sum(lengths[i] for i in ids) // (num_gpus * bucket)))
        best: tuple[float, int, list[MicrobatchSpec], float] | None = None
        for m in range(m0, m0 + max(1, self.sweep)):
            quota = total_work / (num_gpus * m) * (1.0 + self.delta)
            need = dict(memory_need)
            if self.workload_cp:
                for i in ids:
                    while need[i] < num_gpus and work(lengths[i]) / need[i] > quota:
                        need[i] = next(c for c in sizes if c > need[i])
            steps: list[list[_Group]] = []
            left = order
            while left:
                last = len(steps) >= m - 1
                groups, left = _fill_step(
                    left,
                    lengths=lengths,
                    need=need,
                    work=work,
                    num_gpus=num_gpus,
                    bucket_tokens=bucket,
                    quota=None if last else quota,
                    caps=caps,
                )
                steps.append(groups)
            specs = [
                make_spec(
                    step=step,
                    ranks=tuple(range(g.start, g.start + g.size)),
                    local=[() for _ in range(g.size)],
                    sharded=g.ids,
                )
                for step, groups in enumerate(steps)
                for g in groups
            ]
            estimated, sync_ms = _estimate(specs, lengths, model, problem.parallel)
            if best is None or estimated < best[0] - TIE_MS:
                best = (estimated, m, specs, sync_ms)
        assert best is not None
        return best[2], best[3]


def _estimate(
    specs: Sequence[MicrobatchSpec], lengths: Sequence[int], model: CostModel, parallel: Parallel
) -> tuple[float, float]:
    """(reference iteration time (eq. 8), synchronized makespan) of one iteration's microbatches."""
    it = model.price_iteration(specs, lengths, parallel=parallel, index=0)
    return it.estimated_ms, synchronized_iteration_ms(it, parallel.num_gpus)

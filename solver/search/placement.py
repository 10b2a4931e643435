"""The best placement of a set of sequences inside one microbatch of N GPUs (DACP, Skrull eqs. 1-7).

Candidates, the fastest that fits the bucket wins:

* Skrull's DACP (``planners.dacp``), on small microbatches;
* everything sharded (plain CP; also WLB-LLM's and Hydraulis's choice);
* "shard the k largest, then place the rest largest-first on the least-loaded GPU that fits" for small k
  (LPT, Graham 1969): DACP's ascending order leaves the largest local sequences to last.

Results are cached by the sorted id tuple, so a search that tries the same set twice pays once.

A placement is O(K * N) at worst (K sequences, N GPUs: a full GPU is skipped per sequence): at CP 1024 one
microbatch of about 1,700 short sequences took 0.52 s, begun 0.33 s before its search's deadline. So a
placement reads its search's clock every ``CHECK_WORK`` steps and gives up at the deadline (``best`` then
returns None, "no placement found", which no search move accepts, and caches nothing).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence

from skrull.solver.cost import CostModel
from skrull.solver.ilp.builder import GroupMicrobatch
from skrull.solver.planners.dacp import SHARDED, dacp_place
from skrull.solver.search.clock import Clock

#: How many of the largest sequences of a microbatch the LPT placement tries sharding first.
MAX_SHARDED_PREFIX = 4
#: DACP is tried on microbatches of at most this many sequences: on larger ones it costs a third of a
#: placement and beat the LPT candidates on 3 of 182 sampled microbatches, by 0.3% at most.
DACP_MAX_SEQUENCES = 12
#: Cache entries kept per group size before the cache is cleared (bounds memory on long searches).
CACHE_LIMIT = 200_000
#: Steps (sequences placed, full GPUs skipped) between two readings of the clock inside one placement.
CHECK_WORK = 4096


class _OutOfTime(Exception):
    """A placement reached its deadline."""


class Placer:
    """Best placements for one group size ``n`` (on one link, with topology) under one cost model."""

    def __init__(
        self,
        lengths: Sequence[int],
        cost: CostModel,
        group_size: int,
        *,
        clock: Clock = time.monotonic,
        link: str | None = None,
    ) -> None:
        self.lengths = lengths
        #: placements give up at ``deadline`` on ``clock`` (the search's; module docstring)
        self.clock = clock
        self.deadline = math.inf
        self._work = 0
        self.cost = cost
        self.n = group_size
        #: the link the group's ranks use (``CostModel.link_of``; None: the profile has no topology, or an
        #: aligned group of this size)
        self.link = link
        ms_per_flop = cost.profile.compute.ms_per_tflop / 1e12
        self._flops_ms = [ms_per_flop * cost.flops(s) for s in lengths]
        self._floor_ms = cost.microbatch_overhead_ms + cost.profile.compute.fixed_ms
        #: a group no allowed mode shards on (Ulysses alone, a size not dividing the heads) holds local only
        self._can_shard = cost.shards_on(group_size)
        self._cache: dict[tuple[int, ...], tuple[GroupMicrobatch, float] | None] = {}

    def time(self, mb: GroupMicrobatch) -> float:
        local, sharded = mb
        ls = self.lengths
        return self.cost.microbatch_time_ms(
            [[ls[i] for i in ids] for ids in local], [ls[i] for i in sharded], link=self.link
        )

    def fits(self, mb: GroupMicrobatch) -> bool:
        local, sharded = mb
        ls = self.lengths
        if sharded and not self._can_shard:
            return False
        return self.cost.fits([[ls[i] for i in ids] for ids in local], [ls[i] for i in sharded])

    def lower_ms(self, ids: Sequence[int]) -> float:
        """No placement of ``ids`` on this group is faster: the overhead and one fixed compute term, plus
        the average GPU's share of the FLOPs (the slowest GPU computes at least the average)."""
        fm = self._flops_ms
        return self._floor_ms + sum(fm[i] for i in ids) / self.n

    def best(self, ids: Sequence[int]) -> tuple[GroupMicrobatch, float] | None:
        """The fastest candidate placement of ``ids`` in one microbatch, or None if none fits."""
        key = tuple(sorted(ids))
        hit = self._cache.get(key, False)
        if hit is not False:
            return hit  # type: ignore[return-value]
        found: tuple[GroupMicrobatch, float] | None = None
        if self.n * self.cost.bucket_tokens >= sum(self.lengths[i] for i in key):  # else nothing fits (eq. 7)
            try:
                candidates = self._candidates(key)
            except _OutOfTime:
                return None  # not cached: with time it may fit
            for candidate in candidates:
                if candidate is not None and (found is None or candidate[1] < found[1] - 1e-12):
                    found = candidate
        if len(self._cache) >= CACHE_LIMIT:
            self._cache.clear()
        self._cache[key] = found
        return found

    def _tick(self, steps: int) -> None:
        """Count ``steps`` of work; every ``CHECK_WORK`` of them, give up if the deadline has passed."""
        self._work += steps
        if self._work >= CHECK_WORK:
            self._work = 0
            if self.clock() >= self.deadline:
                raise _OutOfTime

    def _checked(self, mb: GroupMicrobatch) -> tuple[GroupMicrobatch, float] | None:
        return (mb, self.time(mb)) if self.fits(mb) else None

    def _candidates(self, ids: tuple[int, ...]) -> list[tuple[GroupMicrobatch, float] | None]:
        n, ls, cost = self.n, self.lengths, self.cost
        out = [self._checked(normalise([[] for _ in range(n)], list(ids), n))]
        if n == 1:
            return out
        ret = None
        if len(ids) <= DACP_MAX_SEQUENCES:
            gathered = (lambda t: cost.view_gathered_kv_tokens(t, n)) if cost.gathered_kv_ratio else None
            ret = dacp_place(
                [ls[i] for i in ids],
                group_size=n,
                bucket_tokens=cost.bucket_tokens,
                flops=cost.flops,
                gathered=gathered,
            )
        if ret is not None:
            local: list[list[int]] = [[] for _ in range(n)]
            sharded = []
            for i, where in zip(ids, ret, strict=True):
                (sharded.append(i) if where == SHARDED else local[where].append(i))
            out.append(self._checked(normalise(local, sharded, n)))
        by_size = sorted(ids, key=lambda i: -ls[i])
        for k in range(min(MAX_SHARDED_PREFIX, len(ids)) + 1):
            out.append(self._lpt(by_size[k:], by_size[:k]))
        return out

    def _lpt(self, rest: list[int], sharded: list[int]) -> tuple[GroupMicrobatch, float] | None:
        """Shard ``sharded``, then each of ``rest`` whole on the least-loaded GPU with room (else
        sharded too). Timed from the loads it keeps: ``microbatch_ms + max_j(max(T_comm, T_comp(local
        j))) + T_comp(sharded / n)`` (eqs. 1-5)."""
        n, ls, cost = self.n, self.lengths, self.cost
        sharded_tokens = sum(ls[i] for i in sharded)
        # per GPU, scaled by n, less the gathered K/V of the sharded tokens (CostModel.fits)
        cap = n * (cost.bucket_tokens - cost.view_gathered_kv_tokens(sharded_tokens, n)) - sharded_tokens
        if cap < 0:
            return None
        room = [cap] * n
        local: list[list[int]] = [[] for _ in range(n)]
        extra = list(sharded)
        heap = [(0.0, j) for j in range(n)]  # (load, GPU): the least-loaded GPU on top
        fm = self._flops_ms
        for i in rest:
            need = n * ls[i]
            skipped = []
            while heap and room[heap[0][1]] < need:
                skipped.append(heapq.heappop(heap))
            self._tick(1 + len(skipped))
            if heap:
                load, j = heapq.heappop(heap)
                local[j].append(i)
                room[j] -= need
                heapq.heappush(heap, (load + fm[i], j))
            else:
                extra.append(i)
            for item in skipped:
                heapq.heappush(heap, item)
        mb = normalise(local, extra, n)
        if len(extra) > len(sharded) or (extra and not self._can_shard):
            return self._checked(mb)  # overflow sharded after the rooms were set: check the bucket again
        if cost.profile.overlap is not None:
            return mb, self.time(mb)  # the loads below time the plain overlap form only
        fixed = cost.profile.compute.fixed_ms
        comm = cost.comm_ms(sum(ls[i] for i in extra), n, link=self.link)
        dist = cost.t_comp_ms(sum(cost.flops(ls[i]) for i in extra) / n)
        worst = max((max(comm, load + fixed) if load > 0 else comm) for load, _ in heap) if extra else 0.0
        if not extra:
            worst = max((load + fixed for load, _ in heap if load > 0), default=0.0)
        return mb, cost.microbatch_overhead_ms + worst + dist


def normalise(local: Sequence[Sequence[int]], sharded: Sequence[int], n: int) -> GroupMicrobatch:
    """Sorted ids; on one GPU "sharded" means "whole on that GPU"."""
    if n == 1 and sharded:
        local = [[*local[0], *sharded]]
        sharded = []
    return tuple(tuple(sorted(ids)) for ids in local), tuple(sorted(sharded))


def mb_ids(mb: GroupMicrobatch) -> list[int]:
    local, sharded = mb
    return [i for ids in local for i in ids] + list(sharded)

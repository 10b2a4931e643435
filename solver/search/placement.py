"""The best placement of a set of sequences inside one microbatch of N GPUs (DACP, Skrull eqs. 1-7).

Candidates, the fastest that fits the bucket wins:

* Skrull's DACP (``planners.dacp``);
* everything sharded (plain CP; also WLB-LLM's and Hydraulis's choice);
* "shard the k largest, then place the rest largest-first on the least-loaded GPU that fits" for small k
  (LPT, Graham 1969): DACP's ascending order leaves the largest local sequences to last.

Results are cached by the sorted id tuple, so a search that tries the same set twice pays once.
"""

from __future__ import annotations

from collections.abc import Sequence

from skrull.solver.cost import CostModel
from skrull.solver.ilp.builder import GroupMicrobatch
from skrull.solver.planners.dacp import SHARDED, dacp_place

#: How many of the largest sequences of a microbatch the LPT placement tries sharding first.
MAX_SHARDED_PREFIX = 4
#: Cache entries kept per group size before the cache is cleared (bounds memory on long searches).
CACHE_LIMIT = 200_000


class Placer:
    """Best placements for one group size ``n`` under one cost model."""

    def __init__(self, lengths: Sequence[int], cost: CostModel, group_size: int) -> None:
        self.lengths = lengths
        self.cost = cost
        self.n = group_size
        self._cache: dict[tuple[int, ...], tuple[GroupMicrobatch, float] | None] = {}

    def time(self, mb: GroupMicrobatch) -> float:
        local, sharded = mb
        ls = self.lengths
        return self.cost.microbatch_time_ms([[ls[i] for i in ids] for ids in local], [ls[i] for i in sharded])

    def fits(self, mb: GroupMicrobatch) -> bool:
        local, sharded = mb
        ls = self.lengths
        return self.cost.fits([[ls[i] for i in ids] for ids in local], [ls[i] for i in sharded])

    def best(self, ids: Sequence[int]) -> tuple[GroupMicrobatch, float] | None:
        """The fastest candidate placement of ``ids`` in one microbatch, or None if none fits."""
        key = tuple(sorted(ids))
        hit = self._cache.get(key, False)
        if hit is not False:
            return hit  # type: ignore[return-value]
        if self.n * self.cost.bucket_tokens < sum(self.lengths[i] for i in key):
            found = None  # cannot fit: each of the n GPUs holds at most the bucket (eq. 7)
        else:
            found = None
            for mb in self._candidates(key):
                if mb is None or not self.fits(mb):
                    continue
                t = self.time(mb)
                if found is None or t < found[1] - 1e-12:
                    found = (mb, t)
        if len(self._cache) >= CACHE_LIMIT:
            self._cache.clear()
        self._cache[key] = found
        return found

    def _candidates(self, ids: tuple[int, ...]) -> list[GroupMicrobatch | None]:
        n, ls, cost = self.n, self.lengths, self.cost
        out: list[GroupMicrobatch | None] = [normalise([[] for _ in range(n)], list(ids), n)]
        if n == 1:
            return out
        ret = dacp_place([ls[i] for i in ids], group_size=n, bucket_tokens=cost.bucket_tokens, flops=cost.flops)
        if ret is not None:
            local: list[list[int]] = [[] for _ in range(n)]
            sharded = []
            for i, where in zip(ids, ret, strict=True):
                (sharded.append(i) if where == SHARDED else local[where].append(i))
            out.append(normalise(local, sharded, n))
        by_size = sorted(ids, key=lambda i: -ls[i])
        for k in range(min(MAX_SHARDED_PREFIX, len(ids)) + 1):
            out.append(self._lpt(by_size[k:], by_size[:k]))
        return out

    def _lpt(self, rest: list[int], sharded: list[int]) -> GroupMicrobatch | None:
        n, ls, cost = self.n, self.lengths, self.cost
        cap = n * cost.bucket_tokens - sum(ls[i] for i in sharded)  # per GPU, scaled by n
        if cap < 0:
            return None
        loads = [0.0] * n
        room = [cap] * n
        local: list[list[int]] = [[] for _ in range(n)]
        extra = list(sharded)
        for i in rest:
            s = ls[i]
            fitting = [j for j in range(n) if room[j] >= n * s]
            if not fitting:
                extra.append(i)
                continue
            j = min(fitting, key=loads.__getitem__)
            local[j].append(i)
            loads[j] += cost.flops(s)
            room[j] -= n * s
        return normalise(local, extra, n)


def normalise(local: Sequence[Sequence[int]], sharded: Sequence[int], n: int) -> GroupMicrobatch:
    """Sorted ids; on one GPU "sharded" means "whole on that GPU"."""
    if n == 1 and sharded:
        local = [[*local[0], *sharded]]
        sharded = []
    return tuple(tuple(sorted(ids)) for ids in local), tuple(sorted(sharded))


def mb_ids(mb: GroupMicrobatch) -> list[int]:
    local, sharded = mb
    return [i for ids in local for i in ids] + list(sharded)

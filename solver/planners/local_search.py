"""Local search over static-layout plans: better in-microbatch placement, moves, swaps and merges.

Moves, each kept only when it lowers the plan's objective (the slowest DP rank), or keeps it and lowers
the summed time of the ranks involved:

* re-place a microbatch: the best of Skrull's DACP, everything sharded, and "shard the k largest, then
  place the rest largest-first on the least-loaded GPU that fits" for small k (LPT, Graham 1969) -
  DACP's ascending order leaves the largest local sequences to last and unbalances the group;
* move one sequence of the slowest DP rank into a microbatch of another rank (or a new one);
* swap two sequences between the slowest DP rank and another;
* merge two microbatches of the slowest DP rank (one microbatch overhead less).

Every candidate microbatch is checked against the bucket (eq. 7) before it is costed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from skrull.solver.cost import CostModel
from skrull.solver.ilp.builder import GroupMicrobatch
from skrull.solver.planners.dacp import SHARDED, dacp_place

Groups = list[list[GroupMicrobatch]]
#: How many of the largest sequences of a microbatch the LPT placement tries sharding first.
MAX_SHARDED_PREFIX = 4


class _Evaluator:
    def __init__(self, lengths: Sequence[int], cost: CostModel, group_size: int) -> None:
        self.lengths = lengths
        self.cost = cost
        self.n = group_size
        self._placement_cache: dict[tuple[int, ...], tuple[GroupMicrobatch, float] | None] = {}

    def time(self, mb: GroupMicrobatch) -> float:
        local, sharded = mb
        ls = self.lengths
        return self.cost.microbatch_time_ms([[ls[i] for i in ids] for ids in local], [ls[i] for i in sharded])

    def fits(self, mb: GroupMicrobatch) -> bool:
        local, sharded = mb
        ls = self.lengths
        return self.cost.fits([[ls[i] for i in ids] for ids in local], [ls[i] for i in sharded])

    def best_placement(self, ids: Sequence[int]) -> tuple[GroupMicrobatch, float] | None:
        """The fastest placement of these sequences in one microbatch among the candidates, or None."""
        key = tuple(sorted(ids))
        if key in self._placement_cache:
            return self._placement_cache[key]
        best: tuple[GroupMicrobatch, float] | None = None
        for mb in self._candidates(key):
            if mb is None or not self.fits(mb):
                continue
            t = self.time(mb)
            if best is None or t < best[1] - 1e-12:
                best = (mb, t)
        self._placement_cache[key] = best
        return best

    def _candidates(self, ids: tuple[int, ...]) -> list[GroupMicrobatch | None]:
        n, ls, cost = self.n, self.lengths, self.cost
        out: list[GroupMicrobatch | None] = []
        ret = dacp_place([ls[i] for i in ids], group_size=n, bucket_tokens=cost.bucket_tokens, flops=cost.flops)
        if ret is not None:
            local: list[list[int]] = [[] for _ in range(n)]
            sharded = []
            for i, where in zip(ids, ret, strict=True):
                (sharded.append(i) if where == SHARDED else local[where].append(i))
            out.append(_normalise(local, sharded, n))
        out.append(_normalise([[] for _ in range(n)], list(ids), n))
        by_flops = sorted(ids, key=lambda i: -ls[i])
        for k in range(min(MAX_SHARDED_PREFIX, len(ids)) + 1):
            out.append(self._lpt(by_flops[k:], by_flops[:k]))
        return out

    def _lpt(self, rest: list[int], sharded: list[int]) -> GroupMicrobatch | None:
        n, ls, cost = self.n, self.lengths, self.cost
        shard_tokens = sum(ls[i] for i in sharded)
        cap = n * cost.bucket_tokens - shard_tokens  # per GPU, scaled by n
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
        return _normalise(local, extra, n)


def _normalise(local: list[list[int]], sharded: list[int], n: int) -> GroupMicrobatch:
    if n == 1 and sharded:
        local = [local[0] + sharded]
        sharded = []
    return tuple(tuple(sorted(ids)) for ids in local), tuple(sorted(sharded))


def _ids(mb: GroupMicrobatch) -> list[int]:
    local, sharded = mb
    return [i for ids in local for i in ids] + list(sharded)


def improve(groups: Groups, *, lengths: Sequence[int], cost: CostModel, group_size: int, deadline: float) -> Groups:
    """Hill-climb from ``groups`` until no move helps or ``time.monotonic()`` passes ``deadline``."""
    ev = _Evaluator(lengths, cost, group_size)
    cur = [list(g) for g in groups]
    mb_t = [[ev.time(mb) for mb in g] for g in cur]

    # Re-place every microbatch (independent of the others).
    for g, grp in enumerate(cur):
        for m, mb in enumerate(grp):
            best = ev.best_placement(_ids(mb))
            if best is not None and best[1] < mb_t[g][m] - 1e-9:
                grp[m], mb_t[g][m] = best

    def total(g: int) -> float:
        return sum(mb_t[g])

    improved = True
    while improved and time.monotonic() < deadline:
        improved = False
        order = sorted(range(len(cur)), key=lambda g: -total(g))
        crit = order[0]
        crit_t = total(crit)
        # Merge two microbatches of the slowest rank.
        for a in range(len(cur[crit])):
            for b in range(a + 1, len(cur[crit])):
                best = ev.best_placement(_ids(cur[crit][a]) + _ids(cur[crit][b]))
                if best is not None and best[1] < mb_t[crit][a] + mb_t[crit][b] - 1e-9:
                    cur[crit][a], mb_t[crit][a] = best
                    del cur[crit][b], mb_t[crit][b]
                    improved = True
                    break
            if improved or time.monotonic() >= deadline:
                break
        if improved:
            continue
        # Move one sequence from the slowest rank to another rank (existing or new microbatch).
        for other in order[1:]:
            if _try_move(ev, cur, mb_t, crit, other, crit_t, deadline) or _try_swap(
                ev, cur, mb_t, crit, other, crit_t, deadline
            ):
                improved = True
                break
            if time.monotonic() >= deadline:
                break
    return [g for g in cur]


def _try_move(
    ev: _Evaluator, cur: Groups, mb_t: list[list[float]], crit: int, other: int, crit_t: float, deadline: float
) -> bool:
    other_t = sum(mb_t[other])
    ls = ev.lengths
    for m, mb in sorted(enumerate(cur[crit]), key=lambda x: -mb_t[crit][x[0]]):
        ids = _ids(mb)
        for i in sorted(ids, key=lambda i: -ls[i]):
            if time.monotonic() >= deadline:
                return False
            rest = [x for x in ids if x != i]
            src = ev.best_placement(rest) if rest else None
            if rest and src is None:
                continue
            new_src_t = src[1] if src is not None else 0.0
            for k in range(len(cur[other]) + 1):
                target_ids = [*_ids(cur[other][k]), i] if k < len(cur[other]) else [i]
                dst = ev.best_placement(target_ids)
                if dst is None:
                    continue
                old_k = mb_t[other][k] if k < len(cur[other]) else 0.0
                new_crit = crit_t - mb_t[crit][m] + new_src_t
                new_other = other_t - old_k + dst[1]
                if max(new_crit, new_other) < crit_t - 1e-9:
                    if k < len(cur[other]):
                        cur[other][k], mb_t[other][k] = dst
                    else:
                        cur[other].append(dst[0])
                        mb_t[other].append(dst[1])
                    if src is None:
                        del cur[crit][m], mb_t[crit][m]
                    else:
                        cur[crit][m], mb_t[crit][m] = src
                    return True
    return False


def _try_swap(
    ev: _Evaluator, cur: Groups, mb_t: list[list[float]], crit: int, other: int, crit_t: float, deadline: float
) -> bool:
    other_t = sum(mb_t[other])
    ls = ev.lengths
    for m, mb in sorted(enumerate(cur[crit]), key=lambda x: -mb_t[crit][x[0]]):
        a_ids = _ids(mb)
        for k, omb in enumerate(cur[other]):
            b_ids = _ids(omb)
            for i in sorted(a_ids, key=lambda i: -ls[i])[:8]:
                for j in b_ids:
                    if ls[j] >= ls[i]:
                        continue
                    if time.monotonic() >= deadline:
                        return False
                    src = ev.best_placement([x for x in a_ids if x != i] + [j])
                    dst = ev.best_placement([x for x in b_ids if x != j] + [i])
                    if src is None or dst is None:
                        continue
                    new_crit = crit_t - mb_t[crit][m] + src[1]
                    new_other = other_t - mb_t[other][k] + dst[1]
                    if max(new_crit, new_other) < crit_t - 1e-9:
                        cur[crit][m], mb_t[crit][m] = src
                        cur[other][k], mb_t[other][k] = dst
                        return True
    return False

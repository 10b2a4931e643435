"""DACP placement inside one microbatch (Skrull section 4.3.2, Alg. 1 and Alg. 3; round-robin of B.2).

Given the lengths of one microbatch's sequences, a CP degree N and a bucket of C tokens per GPU, decide
for every sequence: whole on one CP rank (``0..N-1``) or sharded over all N (``SHARDED``).

Choices where the paper is ambiguous (written down here, pinned by tests):

* Memory is tracked exactly in integers scaled by N: a local sequence of S tokens costs ``N*S`` on its
  rank, a sharded one ``S`` on every rank, and each rank holds ``N*C``. This is eq. 7 without rounding.
* ``FLOPs(S, N)`` of Alg. 3 is read as ``FLOPs(S) / N``, as in the reference cost model.
* Sharding a sequence costs S/N on *every* rank, so a rollback (Alg. 3) is only applied when every other
  rank can take the S/N share; the paper's line 15 has the sign of the freed memory reversed and updates
  only the rolled-back rank. Here a rollback frees ``S - S/N`` on its rank and charges ``S/N`` (memory and
  ``FLOPs(S)/N`` load) to every rank, so the bookkeeping always equals what the plan will hold.
* Rollback candidates are the rank's local sequences in placement order (smallest first, as Alg. 3 scans
  ``ret`` in sorted order). If none of rank t's sequences can be rolled back, the other ranks are tried
  in order of least remaining bucket; if no local sequence anywhere can move, placement fails and GDS
  gives the rank one more microbatch (section 4.3.2: "GDS will restore the batching plan").
* Ties in argmin/argmax go to the lowest CP rank.
* The gathered K/V (CONTRACT.md; ``CostModel.gathered_kv_tokens``): an all-gather microbatch keeps
  ``g(T)`` bucket tokens of K/V on every rank for its ``T`` sharded tokens, so a rank fits when
  ``N*local + T <= N*(C - g(T))``: every check reserves ``N * g(T)`` of each rank's scaled bucket for the
  sharded tokens so far (and, before sharding one more, for ``T + S``). Without ``gathered`` (or g = 0)
  every check is the one above.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

SHARDED = -1


class _Buckets:
    """Remaining bucket (scaled by N) and compute load per CP rank, and who holds which local sequence."""

    __slots__ = ("flops", "gathered", "load", "local", "n", "remain", "sharded")

    def __init__(
        self,
        group_size: int,
        bucket_tokens: int,
        flops: Callable[[int], float] | None,
        gathered: Callable[[int], int] | None = None,
    ) -> None:
        self.n = group_size
        self.remain = [group_size * bucket_tokens] * group_size
        self.load = [0.0] * group_size
        self.local: list[list[int]] = [[] for _ in range(group_size)]
        self.flops = flops
        self.gathered = gathered
        self.sharded = 0

    def reserve(self, sharded_tokens: int) -> int:
        """``N * g(T)``: each rank's scaled bucket the gathered K/V of ``T`` sharded tokens takes (module doc)."""
        return self.n * self.gathered(sharded_tokens) if self.gathered is not None else 0

    def argmin_load(self) -> int:
        load = self.load
        return min(range(self.n), key=load.__getitem__)

    def argmax_remain(self) -> int:
        remain = self.remain
        return max(range(self.n), key=remain.__getitem__)

    def argmin_remain(self) -> int:
        remain = self.remain
        return min(range(self.n), key=remain.__getitem__)

    def put_local(self, idx: int, length: int, rank: int) -> None:  # Alg. 3 UpdateLocal
        self.remain[rank] -= self.n * length
        if self.flops is not None:
            self.load[rank] += self.flops(length)
        self.local[rank].append(idx)

    def put_sharded(self, length: int) -> None:  # Alg. 3 UpdateAll
        share = self.flops(length) / self.n if self.flops is not None else 0.0
        self.sharded += length
        for j in range(self.n):
            self.remain[j] -= length
            self.load[j] += share

    def rollback(self, rank: int, lengths: Sequence[int], ret: list[int]) -> bool:
        """Alg. 3 RollBack: turn one local sequence into a sharded one to relieve ``rank``'s bucket."""
        others = sorted((j for j in range(self.n) if j != rank), key=self.remain.__getitem__)
        for r in (rank, *others):
            for pos, idx in enumerate(self.local[r]):
                s = lengths[idx]
                need = s + self.reserve(self.sharded + s)
                if self.remain[r] + (self.n - 1) * s >= need - s and all(
                    self.remain[j] >= need for j in range(self.n) if j != r
                ):
                    del self.local[r][pos]
                    self.remain[r] += self.n * s
                    if self.flops is not None:
                        self.load[r] -= self.flops(s)
                    self.put_sharded(s)
                    ret[idx] = SHARDED
                    return True
        return False


def _place_in_order(
    lengths: Sequence[int],
    order: Sequence[int],
    state: _Buckets,
    *,
    choose_rank: Callable[[_Buckets], int],
    rollback: bool,
) -> list[int] | None:
    """The placement loop Alg. 1 and B.2 share: in ``order``, each sequence goes whole to
    ``choose_rank``'s rank, else to the rank with the most bucket left, if it fits there; else it is
    sharded if every rank can take S/N; else a local sequence is rolled back (Alg. 3) and the same
    sequence is tried again (Alg. 1 line 19). ``None`` when nothing can be rolled back."""
    n = state.n
    ret = [SHARDED] * len(lengths)
    pos = 0
    while pos < len(order):
        i = order[pos]
        s = lengths[i]
        t = choose_rank(state)
        need = n * s + state.reserve(state.sharded)
        if state.remain[t] < need:
            t = state.argmax_remain()
        if state.remain[t] >= need:
            state.put_local(i, s, t)
            ret[i] = t
        elif state.remain[state.argmin_remain()] >= s + state.reserve(state.sharded + s):
            state.put_sharded(s)
            ret[i] = SHARDED
        elif rollback and state.rollback(state.argmin_remain(), lengths, ret):
            continue
        else:
            return None
        pos += 1
    return ret


def dacp_place(
    lengths: Sequence[int],
    *,
    group_size: int,
    bucket_tokens: int,
    flops: Callable[[int], float],
    rollback: bool = True,
    gathered: Callable[[int], int] | None = None,
) -> list[int] | None:
    """Skrull's DACP heuristic (Alg. 1): ``ret[i]`` is the CP rank holding sequence i, or ``SHARDED``.

    Sequences are visited in ascending length; each goes to the least-loaded rank if it fits there, else
    to the rank with the most bucket left, else it is sharded if every rank can take S/N, else a local
    sequence is rolled back (Alg. 3) and the same sequence is tried again. Returns ``None`` when the
    microbatch cannot be placed (rollback impossible, or disabled with ``rollback=False``).
    """
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    state = _Buckets(group_size, bucket_tokens, flops, gathered)
    return _place_in_order(lengths, order, state, choose_rank=_Buckets.argmin_load, rollback=rollback)


def round_robin_place(
    lengths: Sequence[int],
    *,
    group_size: int,
    bucket_tokens: int,
    flops: Callable[[int], float] | None = None,
    rollback: bool = True,
    gathered: Callable[[int], int] | None = None,
) -> list[int] | None:
    """Skrull appendix B.2 round-robin placement: in the given order, each sequence goes whole to the
    rank with the most bucket left if it fits, else it is sharded if every rank can take S/N, else a
    local sequence is rolled back (memory only: no compute balancing, ``L`` is None in Alg. 3)."""
    state = _Buckets(group_size, bucket_tokens, None, gathered)
    return _place_in_order(lengths, range(len(lengths)), state, choose_rank=_Buckets.argmax_remain, rollback=rollback)

"""Global Data Scheduling (Skrull section 4.3.2, Alg. 2): DP balance, then microbatches per DP rank.

1. Coarse balance (Alg. 2 line 1, "Binpack(ws, FLOPs(S))"): the paper names bin packing without saying
   which; this is greedy LPT (longest-processing-time first, Graham 1969): sequences in descending
   FLOPs(S) go to the DP rank with the least FLOPs so far (ties: lower id first, lower rank first).
2. Per DP rank, sort ascending and cut into ``m`` microbatches by stride, ``Subset[j::m]``, which pairs
   long sequences with short ones (line 7). ``m`` starts at ``ceil(sum(S) / (C*N))`` (line 2) and grows
   by one (line 5) until every microbatch holds at most ``C*N`` tokens (eq. 10) and passes the in-group
   placement (line 8). With ``m`` equal to the number of sequences every microbatch holds one sequence,
   which always places when ``S <= C*N``, so the loop ends with a valid plan; the paper's bound
   ``init <= K + 1`` is read as "at most one sequence per microbatch".
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

import numpy as np

from skrull.solver.errors import InfeasibleError

Placer = Callable[..., "list[int] | None"]


def balance_dp(ids: Sequence[int], weights: Sequence[float], dp: int) -> list[list[int]]:
    """LPT: assign ``ids`` to ``dp`` bins minimising the heaviest bin greedily; ``weights`` by position."""
    order = sorted(range(len(ids)), key=lambda k: (-weights[k], ids[k]))
    heap = [(0.0, r) for r in range(dp)]
    bins: list[list[int]] = [[] for _ in range(dp)]
    for k in order:
        load, r = heapq.heappop(heap)
        bins[r].append(ids[k])
        heapq.heappush(heap, (load + weights[k], r))
    return bins


def split_rank(
    ids: Sequence[int],
    lengths: Sequence[int],
    *,
    group_size: int,
    bucket_tokens: int,
    place: Placer,
    flops: Callable[[int], float],
    rollback: bool = True,
    gathered: Callable[[int], int] | None = None,
) -> list[tuple[list[int], list[int]]]:
    """Alg. 2 lines 2-12 for one DP rank: microbatches as ``(ids, placement)`` pairs, where
    ``placement[k]`` is the CP rank of ``ids[k]`` or ``SHARDED``. ``gathered``: the gathered K/V's bucket
    tokens per GPU for T sharded tokens (solver/planners/dacp.py), handed to ``place`` when given."""
    if not ids:
        return []
    subset = sorted(ids, key=lambda i: (lengths[i], i))
    sorted_lengths = np.fromiter((lengths[i] for i in subset), dtype=np.int64, count=len(subset))
    capacity = group_size * bucket_tokens
    total = int(sorted_lengths.sum())
    m = max(1, -(-total // capacity))
    failed: int | None = None  # position in ``subset`` of the longest sequence of the last microbatch that failed
    while m <= len(subset):
        # Line 8 first half, for all microbatches at once: any over C*N tokens means this m fails.
        sums = _strided_sums(sorted_lengths, m)
        if int(sums.max()) <= capacity:
            # Each microbatch is handed to the in-group placement in loader order (ids ascending):
            # DACP sorts by length itself (Alg. 1 line 1); round-robin (B.2) takes them as they come.
            microbatches = [sorted(subset[j::m]) for j in range(m)]
            # Line 8 second half. A microbatch count is accepted only if every microbatch places, so the
            # heaviest are tried first: the answer is the same, a failing m is rejected sooner.
            placements: dict[int, list[int]] = {}
            order = np.argsort(-sums, kind="stable").tolist()
            if failed is not None:  # the microbatch now holding the sequence that last failed goes first
                first = failed % m
                order.remove(first)
                order.insert(0, first)
            for j in order:
                placement = place(
                    [lengths[i] for i in microbatches[j]],
                    group_size=group_size,
                    bucket_tokens=bucket_tokens,
                    flops=flops,
                    rollback=rollback,
                    **({} if gathered is None else {"gathered": gathered}),
                )
                if placement is None:
                    failed = max(pos for pos in range(j, len(subset), m))  # its longest sequence's position
                    break
                placements[j] = placement
            else:
                return [(microbatches[j], placements[j]) for j in range(m)]
        m += 1
    raise InfeasibleError(
        f"cannot place DP rank's sequences even one per microbatch (longest {max(lengths[i] for i in subset)} "
        f"tokens, group capacity {capacity})"
    )


def _strided_sums(values: np.ndarray, m: int) -> np.ndarray:
    """``[values[j::m].sum() for j in range(m)]`` in one vectorized pass."""
    pad = (-len(values)) % m
    if pad:
        values = np.concatenate([values, np.zeros(pad, dtype=values.dtype)])
    sums: np.ndarray = values.reshape(-1, m).sum(axis=0)
    return sums

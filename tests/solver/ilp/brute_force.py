"""Exhaustive optimum of tiny iterations, independent of the model: the reference for the ILP tests.

A microbatch's time depends only on its own sequences and their placement, so the optimum is: over
every partition of the sequences into microbatches, give each block its best placement (every
assignment of each sequence to a GPU or to "sharded", within the bucket), then assign blocks to DP
ranks minimising the slowest rank. With ``modes``, each block's sharded work runs in the cheapest of them
its group can run (the reference model priced in each mode in turn).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

from skrull.solver.cost import CostModel


def _partitions(items: list[int]) -> Iterator[list[list[int]]]:
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        for k in range(len(part)):
            yield [*part[:k], [first, *part[k]], *part[k + 1 :]]
        yield [[first], *part]


def best_block_time(
    block: Sequence[int], cost: CostModel, group_size: int, modes: Sequence[str] = ("allgather",)
) -> float | None:
    best = None
    runs = [m for m in modes if cost.mode_fits(group_size, m)]
    choices = range(-1, group_size) if group_size > 1 else range(group_size)
    for assign in itertools.product(choices, repeat=len(block)):
        local: list[list[int]] = [[] for _ in range(group_size)]
        sharded: list[int] = []
        for s, where in zip(block, assign, strict=True):
            (sharded.append(s) if where < 0 else local[where].append(s))
        if not cost.fits(local, sharded):
            continue
        if sharded and group_size > 1 and not runs:
            continue  # no allowed mode runs on this group
        for mode in runs if sharded and group_size > 1 else ["allgather"]:
            t = cost.microbatch_time_ms(local, sharded, mode)
            best = t if best is None else min(best, t)
    return best


def optimum_ms(
    lengths: Sequence[int], cost: CostModel, *, dp: int, cp: int, modes: Sequence[str] = ("allgather",)
) -> float:
    cache: dict[tuple[int, ...], float | None] = {}
    best = float("inf")
    for part in _partitions(list(range(len(lengths)))):
        times = []
        for block in part:
            key = tuple(sorted(lengths[i] for i in block))
            if key not in cache:
                cache[key] = best_block_time(key, cost, cp, modes)
            t = cache[key]
            if t is None:
                break
            times.append(t)
        else:
            for owners in itertools.product(range(dp), repeat=len(times)):
                loads = [0.0] * dp
                for t, g in zip(times, owners, strict=True):
                    loads[g] += t
                best = min(best, max(loads))
    return best


def flexible_optimum_ms(
    lengths: Sequence[int],
    cost: CostModel,
    groups: Sequence[tuple[int, ...]],
    gpus: int,
    modes: Sequence[str] = ("allgather",),
) -> float:
    """Exhaustive optimum when each microbatch may run on any of ``groups`` (GPU ranks): over every
    partition into microbatches and every choice of group per microbatch, the slowest GPU's summed time."""
    cache: dict[tuple[tuple[int, ...], int], float | None] = {}
    best = float("inf")
    for part in _partitions(list(range(len(lengths)))):
        for owners in itertools.product(range(len(groups)), repeat=len(part)):
            loads = [0.0] * gpus
            for block, g in zip(part, owners, strict=True):
                key = (tuple(sorted(lengths[i] for i in block)), len(groups[g]))
                if key not in cache:
                    cache[key] = best_block_time(key[0], cost, key[1], modes)
                t = cache[key]
                if t is None:
                    break
                for r in groups[g]:
                    loads[r] += t
            else:
                best = min(best, max(loads))
    return best

"""Exhaustive optimum of tiny iterations, independent of the model: the reference for the ILP tests.

A microbatch's time depends only on its own sequences and their placement, so the optimum is: over
every partition of the sequences into microbatches, give each block its best placement (every
assignment of each sequence to a GPU or to "sharded", within the bucket), then assign blocks to DP
ranks minimising the slowest rank. With ``modes``, each block's sharded work runs in the cheapest of them
its group can run (the reference model priced in each mode in turn). With a topology, each block is priced
on the link of the group it runs on (``links`` per DP rank; ``CostModel.link_of`` of a flexible group).
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
    block: Sequence[int],
    cost: CostModel,
    group_size: int,
    modes: Sequence[str] = ("allgather",),
    link: str | None = None,
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
            t = cost.microbatch_time_ms(local, sharded, mode, link=link)
            best = t if best is None else min(best, t)
    return best


def optimum_ms(
    lengths: Sequence[int],
    cost: CostModel,
    *,
    dp: int,
    cp: int,
    modes: Sequence[str] = ("allgather",),
    links: Sequence[str | None] | None = None,
) -> float:
    """The static layout's optimum; ``links[g]``: the link DP rank g's CP group uses (topology)."""
    own = list(links) if links is not None else [None] * dp
    cache: dict[tuple[tuple[int, ...], str | None], float | None] = {}
    best = float("inf")
    for part in _partitions(list(range(len(lengths)))):
        keys = [tuple(sorted(lengths[i] for i in block)) for block in part]
        for owners in itertools.product(range(dp), repeat=len(part)):
            loads = [0.0] * dp
            for key, g in zip(keys, owners, strict=True):
                if (key, own[g]) not in cache:
                    cache[key, own[g]] = best_block_time(key, cost, cp, modes, own[g])
                t = cache[key, own[g]]
                if t is None:
                    break
                loads[g] += t
            else:
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
    cache: dict[tuple[tuple[int, ...], int, str | None], float | None] = {}
    best = float("inf")
    for part in _partitions(list(range(len(lengths)))):
        for owners in itertools.product(range(len(groups)), repeat=len(part)):
            loads = [0.0] * gpus
            for block, g in zip(part, owners, strict=True):
                key = (tuple(sorted(lengths[i] for i in block)), len(groups[g]), cost.link_of(groups[g]))
                if key not in cache:
                    cache[key] = best_block_time(key[0], cost, key[1], modes, key[2])
                t = cache[key]
                if t is None:
                    break
                for r in groups[g]:
                    loads[r] += t
            else:
                best = min(best, max(loads))
    return best

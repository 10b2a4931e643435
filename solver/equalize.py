"""Equal, aligned microbatch counts: every GPU of the world runs one microbatch at every step of an iteration.

Why: under FSDP (``fully_shard``) or ZeRO-3 every forward of a microbatch all-gathers parameters over all
ranks, so every rank must run as many forwards as every other, and in the same order as the microbatches
it shares: a GPU whose k-th forward is a microbatch of group G must meet every other member of G in its
k-th forward too, or G's attention collective and the world's all-gather wait on each other. A plan where
one GPU runs 3 microbatches and another 1 hangs the second GPU's collectives until they time out.

A request with ``"equal_microbatches": true`` gets its planner's plan with an empty microbatch (no
sequence) for every GPU at every step of the iteration where it runs nothing: then every GPU runs one
microbatch per distinct step, its k-th at the k-th step, aligned with every group it shares (a
microbatch has one step for all its ranks). The executor runs a forward on no tokens (a padding row) to
take part in the collectives. Planners number steps as rounds, so this adds little: the iteration's
distinct steps are about its largest per-GPU count (bench/equal_microbatches.py).

Cost: an empty microbatch costs ``microbatch_ms`` (eqs. 1-5 with no tokens: no compute, no
communication); the iteration time is still the slowest GPU's sum (eq. 8). One empty microbatch covers a
whole CP group idle at a step (so a static layout stays static and the plan stays small), otherwise one
per idle GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

from skrull.solver.types import Microbatch, MicrobatchSpec, Parallel


def microbatch_counts(specs: Sequence[MicrobatchSpec] | Sequence[Microbatch], num_gpus: int) -> list[int]:
    """How many microbatches each GPU runs in one iteration."""
    counts = [0] * num_gpus
    per_group: dict[tuple[int, ...], int] = {}
    for spec in specs:
        per_group[spec.ranks] = per_group.get(spec.ranks, 0) + 1
    for ranks, n in per_group.items():
        for g in ranks:
            counts[g] += n
    return counts


def equalize_microbatches(specs: Sequence[MicrobatchSpec], parallel: Parallel) -> list[MicrobatchSpec]:
    """``specs`` (one iteration) plus an empty microbatch wherever a GPU is idle at one of its steps."""
    busy_at: dict[int, set[int]] = {}
    groups_at: dict[int, set[tuple[int, ...]]] = {}
    for spec in specs:  # per step, the distinct groups first (a plan reuses few), then their GPUs
        groups_at.setdefault(spec.step, set()).add(spec.ranks)
    for step, groups in groups_at.items():
        busy_at[step] = {g for ranks in groups for g in ranks}
    out = list(specs)
    for step in sorted(busy_at):
        busy = busy_at[step]
        if len(busy) == parallel.num_gpus:
            continue
        for dp_rank in range(parallel.dp):
            group = parallel.cp_group(dp_rank)
            idle = tuple(g for g in group if g not in busy)
            if len(idle) == len(group):  # the whole CP group: one empty microbatch over it
                out.append(_empty(step, idle))
            else:
                out.extend(_empty(step, (g,)) for g in idle)
    return out


def step_sets(specs: Sequence[MicrobatchSpec] | Sequence[Microbatch], num_gpus: int) -> list[frozenset[int]]:
    """The steps at which each GPU runs a microbatch (equal for all GPUs: aligned, equal counts)."""
    per_group: dict[tuple[int, ...], set[int]] = {}
    for spec in specs:
        per_group.setdefault(spec.ranks, set()).add(spec.step)
    steps: list[set[int]] = [set() for _ in range(num_gpus)]
    for ranks, group_steps in per_group.items():
        for g in ranks:
            steps[g] |= group_steps
    return [frozenset(x) for x in steps]


def _empty(step: int, ranks: tuple[int, ...]) -> MicrobatchSpec:
    return MicrobatchSpec(step=step, ranks=ranks, local=tuple(() for _ in ranks), sharded=())

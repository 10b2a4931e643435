"""Equal microbatch counts: every GPU of the world runs the same number of microbatches in an iteration.

Why: under FSDP (``fully_shard``) or ZeRO-3 every forward of a microbatch all-gathers parameters over all
ranks, so every rank must run as many forwards as every other; a plan where one GPU runs 3 microbatches
and another 1 hangs the second GPU's collectives until they time out. A request with
``"equal_microbatches": true`` gets its planner's plan with each GPU's list padded to the iteration's
largest count ``M`` by empty microbatches (no sequence; the executor runs a forward on no tokens, or a
dummy one, to take part in the collectives).

Cost: an empty microbatch costs ``microbatch_ms`` (eqs. 1-5 with no tokens: no compute, no
communication), so a GPU running ``c`` microbatches pays ``(M - c) * microbatch_ms`` more; the
iteration time is still the slowest GPU's sum (eq. 8). The padding goes after each GPU's last step
(steps ``s_max + 1 .. s_max + M``, free on every GPU), one empty microbatch per CP group and step where
the whole group is short (so a static layout stays static and the plan stays small), otherwise per GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

from skrull.solver.types import MicrobatchSpec, Parallel


def microbatch_counts(specs: Sequence[MicrobatchSpec], num_gpus: int) -> list[int]:
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
    """``specs`` (one iteration) plus the empty microbatches that give every GPU the largest count."""
    counts = microbatch_counts(specs, parallel.num_gpus)
    target = max(counts, default=0)
    out = list(specs)
    if target == 0 or min(counts) == target:
        return out
    first_free = max((s.step for s in specs), default=-1) + 1
    for dp_rank in range(parallel.dp):
        group = parallel.cp_group(dp_rank)
        for k in range(target):
            short = tuple(g for g in group if counts[g] + k < target)
            if not short:
                break
            if len(short) == len(group):  # the whole CP group: one empty microbatch over it
                out.append(_empty(first_free + k, short))
            else:
                out.extend(_empty(first_free + k, (g,)) for g in short)
    return out


def _empty(step: int, ranks: tuple[int, ...]) -> MicrobatchSpec:
    return MicrobatchSpec(step=step, ranks=ranks, local=tuple(() for _ in ranks), sharded=())

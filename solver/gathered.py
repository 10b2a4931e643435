"""Keep every planner's microbatches within the bucket once the gathered K/V is counted.

An all-gather microbatch keeps, on every GPU of its group, the K/V of the rest of its sharded sequences
from forward to backward (worker/dacp.py); with ``memory.kv_bytes_per_token`` and
``memory.activation_bytes_per_token`` in the profile the memory rule charges it (CONTRACT.md "Cluster
topology and gathered K/V"; ``CostModel.fits``):

    own_j + r * (N-1)/N * sum(sharded S) <= bucket_tokens,    r = kv / activation bytes per token

(``(2N+1)/(2N)`` instead of ``(N-1)/N`` where ``memory.gathered_kv`` is ``key_prefixes``: the key prefix
of each own piece, what the worker keeps; ``CostModel.gathered_kv_factor``).

The planners that place sequences themselves (GDS + DACP, ``auto``'s search, the exact models) check this
rule as they place. The others (baselines and peers) reproduce a published method whose memory check is
eq. 7 alone; so that no plan ever runs out of memory on a GPU, ``fit_gathered_kv`` runs after every
planner: a microbatch that no allowed mode holds is split on the same group into microbatches that fit
(its local sequences first, then its sharded sequences first-fit, longest first), at consecutive steps
(every later step moves by the same amount, so each GPU's order is kept). Without the two memory figures,
or where every microbatch fits, the planner's output is returned unchanged (the same object). A sequence
that its group cannot hold even alone is refused naming ``cp_modes`` and the sequence: no split makes it
fit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from skrull.solver.cost import CostModel
from skrull.solver.errors import RequestError
from skrull.solver.plan import MicrobatchSpec, Problem
from skrull.solver.planners.base import PlannerOutput


def group_capacity_tokens(problem: Problem) -> int:
    """Tokens one CP group holds in one microbatch of sharded sequences: ``cp * bucket_tokens`` (eq. 10),
    less the gathered K/V where the profile charges it, in the allowed mode that holds most
    (``CostModel.max_sequence_tokens``): the cap the packing planners (baselines, peers) pack to, so
    their microbatches fit as planned."""
    if not problem.profile.kv_bytes_per_token or not problem.profile.activation_bytes_per_token:
        return problem.group_capacity_tokens
    model = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens)
    return model.max_sequence_tokens_in(problem.parallel.cp, problem.cp_modes)


def _pieces(spec: MicrobatchSpec, lengths: Sequence[int], cost: CostModel) -> list[MicrobatchSpec]:
    """``spec`` split into microbatches on its group that each fit (steps 0, 1, ... relative to spec's)."""
    n = len(spec.ranks)
    empty: tuple[tuple[int, ...], ...] = tuple(() for _ in spec.ranks)
    parts: list[tuple[tuple[tuple[int, ...], ...], list[int]]] = []
    if any(spec.local):
        parts.append((spec.local, []))
    for seq in sorted(spec.sharded, key=lambda i: (-lengths[i], i)):
        for local, sharded in parts:
            if cost.fits([[lengths[i] for i in ids] for ids in local], [lengths[i] for i in (*sharded, seq)]):
                sharded.append(seq)
                break
        else:
            if not cost.fits([[] for _ in range(n)], [lengths[seq]]):
                r = cost.gathered_kv_ratio
                raise RequestError(
                    "cp_modes",
                    list(cost.memory_modes(n)),
                    f"sequence {seq} of {lengths[seq]} tokens does not fit a group of {n} GPUs with its gathered "
                    f"K/V (r = kv/activation bytes = {float(r):.4f}: {-(-lengths[seq] // n)} own tokens plus "
                    f"{cost.gathered_kv_tokens(lengths[seq], n)} of K/V over bucket_tokens = {cost.bucket_tokens}); "
                    "allow ulysses, or plan with a wider CP group or a larger bucket",
                )
            parts.append((empty, [seq]))
    return [
        dataclasses.replace(spec, step=k, local=local, sharded=tuple(sharded))
        for k, (local, sharded) in enumerate(parts)
    ]


def fit_gathered_kv(output: PlannerOutput, problem: Problem, modes: Sequence[str]) -> PlannerOutput:
    """``output`` with every microbatch that no mode of ``modes`` holds in memory split on its group (module
    doc). An ``optimal`` status becomes ``feasible`` when anything was split (the bound stays valid: the
    gathered K/V only narrows the plans a bound covers)."""
    if not problem.profile.kv_bytes_per_token or not problem.profile.activation_bytes_per_token:
        return output
    cost = CostModel(problem.profile, bucket_tokens=problem.bucket_tokens, choose_modes=tuple(modes))
    lengths = problem.lengths
    changed = False
    iterations = []
    for specs in output.iterations:
        split: dict[int, list[MicrobatchSpec]] = {}
        for k, spec in enumerate(specs):
            if len(spec.ranks) > 1 and spec.sharded:
                local = [[lengths[i] for i in ids] for ids in spec.local]
                if not cost.fits(local, [lengths[i] for i in spec.sharded], None if len(modes) > 1 else spec.mode):
                    split[k] = _pieces(spec, lengths, cost)
        if not split:
            iterations.append(specs)
            continue
        changed = True
        # every microbatch at step s moves to base[s]; a split one takes base[s], base[s] + 1, ...
        width: dict[int, int] = {}
        for k, spec in enumerate(specs):
            width[spec.step] = max(width.get(spec.step, 1), len(split.get(k, ())) or 1)
        base: dict[int, int] = {}
        at = 0
        for step in sorted(width):
            base[step] = at
            at += width[step]
        out: list[MicrobatchSpec] = []
        for k, spec in enumerate(specs):
            if k in split:
                out.extend(dataclasses.replace(p, step=base[spec.step] + p.step) for p in split[k])
            else:
                out.append(dataclasses.replace(spec, step=base[spec.step]))
        iterations.append(tuple(out))
    if not changed:
        return output
    status = "feasible" if output.status == "optimal" else output.status
    return dataclasses.replace(output, iterations=tuple(iterations), status=status)

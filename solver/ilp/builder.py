"""The joint GDS/DACP model (Skrull eqs. 1-11) under the contract's reference cost model.

For sequences k (length S_k), G identical groups g (DP ranks, each a CP group of N GPUs), microbatch
slots m < M per group and CP ranks j < N:

    y[k,g,m,j] = 1  sequence k whole on CP rank j of microbatch m of group g   (P of eq. 6)
    z[k,g,m]   = 1  sequence k sharded over microbatch m of group g (N > 1)     (D of eq. 6)
    u[g,m], hl[g,m,j], hs[g,m]  microbatch used / has local work on j / has sharded work
    W[g,m]     the DACP time of the microbatch without its overhead (eq. 2, linearised)
    T[g]       the group's summed microbatch time; Z >= T[g] is minimised (eq. 8)

Times are integers: every coefficient is floored at ``TIME_SCALE`` units per ms (model.py), with
    cF_k = ms_per_flop*FLOPs(S_k), cD_k = ms_per_flop*FLOPs(S_k)/N, cC_k = comm_ms_per_token*S_k.

Microbatch slots: a plan no worse than the hint's objective UB runs at most ``floor(UB / microbatch_ms)``
microbatches on any group (each costs at least microbatch_ms), and at most K; ``M`` is the smaller of
the two, plus one slot against the flooring of coefficients (and at least the hint's count).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from skrull.solver.cost import CostModel
from skrull.solver.ilp.model import TIME_SCALE, LinearModel

#: One microbatch of a group, as sequence ids: (local ids per CP rank, sharded ids).
GroupMicrobatch = tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]


@dataclass(slots=True)
class BuiltModel:
    model: LinearModel
    seq_ids: tuple[int, ...]
    num_groups: int
    group_size: int
    num_slots: int
    y: dict[tuple[int, int, int, int], int]
    z: dict[tuple[int, int, int], int]
    objective_var: int

    def decode(self, values: Sequence[int]) -> list[list[GroupMicrobatch]]:
        """Per group, its used microbatches (slot order) as (local ids per CP rank, sharded ids)."""
        slots: dict[tuple[int, int], tuple[list[list[int]], list[int]]] = {}
        n = self.group_size
        for (k, g, m, j), v in self.y.items():
            if values[v] > 0.5:
                slots.setdefault((g, m), ([[] for _ in range(n)], []))[0][j].append(self.seq_ids[k])
        for (k, g, m), v in self.z.items():
            if values[v] > 0.5:
                slots.setdefault((g, m), ([[] for _ in range(n)], []))[1].append(self.seq_ids[k])
        out: list[list[GroupMicrobatch]] = [[] for _ in range(self.num_groups)]
        for (g, _m), (local, sharded) in sorted(slots.items()):
            out[g].append((tuple(tuple(sorted(ids)) for ids in local), tuple(sorted(sharded))))
        return out


@dataclass(frozen=True, slots=True)
class _Coeffs:
    local: tuple[int, ...]
    dist: tuple[int, ...]
    comm: tuple[int, ...]
    comp_fixed: int
    comm_fixed: int
    microbatch: int


def _coefficients(lengths: Sequence[int], model: CostModel, group_size: int) -> _Coeffs:
    p = model.profile
    ms_per_flop = p.compute.ms_per_tflop / 1e12
    comm_per_token = p.comm.ms_per_mib * p.comm.bytes_per_token / 2**20
    floor = math.floor
    return _Coeffs(
        local=tuple(floor(TIME_SCALE * ms_per_flop * model.flops(s)) for s in lengths),
        dist=tuple(floor(TIME_SCALE * ms_per_flop * model.flops(s) / group_size) for s in lengths),
        comm=tuple(floor(TIME_SCALE * comm_per_token * s) for s in lengths),
        comp_fixed=floor(TIME_SCALE * p.compute.fixed_ms),
        comm_fixed=floor(TIME_SCALE * p.comm.fixed_ms),
        microbatch=floor(TIME_SCALE * p.microbatch_ms),
    )


def scaled_microbatch_time(mb: GroupMicrobatch, index: dict[int, int], c: _Coeffs) -> int:
    """The model's (floored) time of one microbatch: overhead + W."""
    local, sharded = mb
    dist = sum(c.dist[index[i]] for i in sharded) + (c.comp_fixed if sharded else 0)
    comm = sum(c.comm[index[i]] for i in sharded) + (c.comm_fixed if sharded else 0)
    worst = comm + dist if sharded else 0
    for ids in local:
        if ids:
            worst = max(worst, sum(c.local[index[i]] for i in ids) + c.comp_fixed + dist)
    return c.microbatch + worst


def build_joint_model(
    *,
    seq_ids: Sequence[int],
    lengths: Sequence[int],
    num_groups: int,
    group_size: int,
    cost: CostModel,
    hint: Sequence[Sequence[GroupMicrobatch]],
    lower_bound_ms: float = 0.0,
    symmetry_breaking: bool = True,
    offsets_ms: Sequence[float] | None = None,
    max_slots: int | None = None,
) -> BuiltModel:
    """Build the joint model for ``seq_ids`` over ``num_groups`` groups, warm-started from ``hint``.

    ``lengths`` are indexed by global sequence id; ``hint[g]`` lists group g's microbatches.
    ``offsets_ms[g]`` is time group g already spends on microbatches outside the model (for
    neighbourhoods of a larger plan); groups with different offsets are not interchangeable.
    ``max_slots`` caps the microbatch slots below the valid bound: the model is then a restriction
    (LNS uses it); its optimum is no longer a proof for the whole problem.
    """
    ids = tuple(seq_ids)
    index = {seq: k for k, seq in enumerate(ids)}
    sizes = [lengths[i] for i in ids]
    n = group_size
    bucket = cost.bucket_tokens
    c = _coefficients(sizes, cost, n)
    m_ = LinearModel()

    # The hint's objective bounds the microbatch slots (see module docstring).
    offsets = [math.floor(o * TIME_SCALE) for o in (offsets_ms or [0.0] * num_groups)]
    hint_times = [
        off + sum(scaled_microbatch_time(mb, index, c) for mb in group)
        for off, group in zip(offsets, hint, strict=True)
    ]
    upper = max(hint_times, default=0)
    room = upper - min(offsets, default=0)
    slots = len(ids) if c.microbatch == 0 else min(len(ids), room // c.microbatch + 1)
    if max_slots is not None:
        slots = min(slots, max_slots)
    slots = max(slots, max((len(group) for group in hint), default=1), 1)
    time_cap = upper if upper > 0 else 1
    interchangeable_groups = len(set(offsets)) <= 1

    y: dict[tuple[int, int, int, int], int] = {}
    z: dict[tuple[int, int, int], int] = {}
    used: dict[tuple[int, int], int] = {}
    has_local: dict[tuple[int, int, int], int] = {}
    has_shard: dict[tuple[int, int], int] = {}
    work: dict[tuple[int, int], int] = {}
    for g in range(num_groups):
        for m in range(slots):
            used[g, m] = m_.binary(f"u[{g},{m}]")
            work[g, m] = m_.var(f"W[{g},{m}]", 0, time_cap)
            for j in range(n):
                has_local[g, m, j] = m_.binary(f"hl[{g},{m},{j}]")
            if n > 1:
                has_shard[g, m] = m_.binary(f"hs[{g},{m}]")
            for k in range(len(ids)):
                for j in range(n):
                    y[k, g, m, j] = m_.binary(f"y[{k},{g},{m},{j}]")
                if n > 1:
                    z[k, g, m] = m_.binary(f"z[{k},{g},{m}]")
    totals = [m_.var(f"T[{g}]", 0, time_cap) for g in range(num_groups)]
    objective = m_.var("Z", 0, time_cap)

    # Every sequence exactly once, whole on one GPU or sharded over one microbatch (eqs. 6, 9).
    for k in range(len(ids)):
        coeffs = {y[k, g, m, j]: 1 for g in range(num_groups) for m in range(slots) for j in range(n)}
        coeffs.update({z[k, g, m]: 1 for g in range(num_groups) for m in range(slots) if n > 1})
        m_.add(coeffs, family="assign", lower=1, upper=1)

    for g in range(num_groups):
        for m in range(slots):
            shard_dist = {z[k, g, m]: c.dist[k] for k in range(len(ids))} if n > 1 else {}
            if n > 1:
                shard_dist[has_shard[g, m]] = c.comp_fixed
            for j in range(n):
                # Memory per GPU, exact in integers: N * local tokens + sharded tokens <= N * C (eq. 7).
                mem = {y[k, g, m, j]: n * sizes[k] for k in range(len(ids))}
                if n > 1:
                    mem.update({z[k, g, m]: sizes[k] for k in range(len(ids))})
                m_.add(mem, family="memory", upper=n * bucket)
                # Local compute of GPU j plus the sharded compute after it (eqs. 2, 3, 4).
                lhs = {work[g, m]: 1}
                for k in range(len(ids)):
                    lhs[y[k, g, m, j]] = -c.local[k]
                lhs[has_local[g, m, j]] = -c.comp_fixed
                for v, coef in shard_dist.items():
                    lhs[v] = lhs.get(v, 0) - coef
                m_.add(lhs, family="time-local", lower=0)
                # Indicators: a sequence on GPU j means GPU j computes; any work means the slot is used.
                for k in range(len(ids)):
                    m_.add({y[k, g, m, j]: 1, has_local[g, m, j]: -1}, family="link-local", upper=0)
                m_.add({has_local[g, m, j]: 1, used[g, m]: -1}, family="link-used", upper=0)
            if n > 1:
                # Communication of the sharded tokens, overlapped with local compute (eqs. 2, 5).
                lhs = {work[g, m]: 1, has_shard[g, m]: -c.comm_fixed}
                for k in range(len(ids)):
                    lhs[z[k, g, m]] = -c.comm[k]
                for v, coef in shard_dist.items():
                    lhs[v] = lhs.get(v, 0) - coef
                m_.add(lhs, family="time-comm", lower=0)
                for k in range(len(ids)):
                    m_.add({z[k, g, m]: 1, has_shard[g, m]: -1}, family="link-shard", upper=0)
                m_.add({has_shard[g, m]: 1, used[g, m]: -1}, family="link-used", upper=0)
                # Redundant (eq. 10, tightened by u): a used microbatch holds at most N * C tokens.
                tokens = {y[k, g, m, j]: sizes[k] for k in range(len(ids)) for j in range(n)}
                tokens.update({z[k, g, m]: sizes[k] for k in range(len(ids))})
                tokens[used[g, m]] = -n * bucket
                m_.add(tokens, family="redundant-group-tokens", upper=0)
                # Redundant: the slowest GPU is no faster than the average GPU (N * W >= all work).
                avg = {work[g, m]: n, has_shard[g, m]: -n * c.comp_fixed}
                for j in range(n):
                    avg[has_local[g, m, j]] = -c.comp_fixed
                for k in range(len(ids)):
                    for j in range(n):
                        avg[y[k, g, m, j]] = -c.local[k]
                    avg[z[k, g, m]] = -n * c.dist[k]
                m_.add(avg, family="redundant-average-gpu", lower=0)
        # Redundant: a used microbatch computes something, so it costs at least one T_comp fixed term.
        for m in range(slots):
            m_.add({work[g, m]: 1, used[g, m]: -c.comp_fixed}, family="redundant-used-computes", lower=0)
        # The group's time is its summed microbatch times; Z is the slowest group (eq. 8).
        total = {totals[g]: 1}
        for m in range(slots):
            total[used[g, m]] = -c.microbatch
            total[work[g, m]] = -1
        m_.add(total, family="group-time", lower=offsets[g], upper=offsets[g])
        m_.add({objective: 1, totals[g]: -1}, family="objective", lower=0)

    if symmetry_breaking:
        for g in range(num_groups - 1 if interchangeable_groups else 0):
            # Interchangeable DP ranks: order groups by time.
            m_.add({totals[g]: 1, totals[g + 1]: -1}, family="symmetry-groups", lower=0)
        for g in range(num_groups):
            for m in range(slots - 1):
                # Interchangeable microbatches: used slots first, ordered by time.
                m_.add({used[g, m]: 1, used[g, m + 1]: -1}, family="symmetry-microbatches", lower=0)
                m_.add(
                    {work[g, m]: 1, used[g, m]: c.microbatch, work[g, m + 1]: -1, used[g, m + 1]: -c.microbatch},
                    family="symmetry-microbatches",
                    lower=0,
                )
            for m in range(slots):
                for j in range(n - 1):
                    # Interchangeable CP ranks: order by local tokens.
                    order = {y[k, g, m, j]: sizes[k] for k in range(len(ids))}
                    for k in range(len(ids)):
                        order[y[k, g, m, j + 1]] = -sizes[k]
                    m_.add(order, family="symmetry-cp-ranks", lower=0)

    # Redundant: no plan beats the contract's lower bound (floored to the model's units).
    m_.add({objective: 1}, family="redundant-lower-bound", lower=math.floor(lower_bound_ms * TIME_SCALE))
    m_.objective = {objective: 1}

    built = BuiltModel(
        model=m_, seq_ids=ids, num_groups=num_groups, group_size=n, num_slots=slots, y=y, z=z, objective_var=objective
    )
    tokens_of = {i: lengths[i] for i in ids}
    m_.hint = _hint_values(
        built,
        hint,
        index,
        tokens_of,
        c,
        used,
        has_local,
        has_shard,
        work,
        totals,
        offsets,
        symmetric=symmetry_breaking,
        sort_groups=symmetry_breaking and interchangeable_groups,
    )
    return built


def _hint_values(
    built: BuiltModel,
    hint: Sequence[Sequence[GroupMicrobatch]],
    index: dict[int, int],
    tokens_of: dict[int, int],
    c: _Coeffs,
    used: dict[tuple[int, int], int],
    has_local: dict[tuple[int, int, int], int],
    has_shard: dict[tuple[int, int], int],
    work: dict[tuple[int, int], int],
    totals: list[int],
    offsets: list[int],
    *,
    symmetric: bool,
    sort_groups: bool,
) -> dict[int, int]:
    """A complete assignment for the hint, permuted to satisfy the symmetry-breaking order."""
    n = built.group_size
    values = dict.fromkeys(range(built.model.num_vars), 0)
    groups = []
    for group in hint:
        mbs = []
        for local, sharded in group:
            order = list(range(n))
            if symmetric:
                order.sort(key=lambda j: -sum(tokens_of[i] for i in local[j]))
            mbs.append((tuple(local[j] for j in order), tuple(sharded)))
        if symmetric:
            mbs.sort(key=lambda mb: -scaled_microbatch_time(mb, index, c))
        groups.append(mbs)
    if sort_groups:
        groups.sort(key=lambda grp: -sum(scaled_microbatch_time(mb, index, c) for mb in grp))
    groups += [[] for _ in range(built.num_groups - len(groups))]
    worst = 0
    for g, group in enumerate(groups):
        total = offsets[g]
        for m, mb in enumerate(group):
            local, sharded = mb
            values[used[g, m]] = 1
            for j, ids in enumerate(local):
                values[has_local[g, m, j]] = 1 if ids else 0
                for i in ids:
                    values[built.y[index[i], g, m, j]] = 1
            if n > 1:
                values[has_shard[g, m]] = 1 if sharded else 0
                for i in sharded:
                    values[built.z[index[i], g, m]] = 1
            t = scaled_microbatch_time(mb, index, c)
            values[work[g, m]] = t - c.microbatch
            total += t
        values[totals[g]] = total
        worst = max(worst, total)
    values[built.objective_var] = worst
    return values

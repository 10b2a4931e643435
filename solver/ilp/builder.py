"""The joint GDS/DACP model (Skrull eqs. 1-11) under the reference cost model.

For sequences k (length S_k), groups g of N_g GPUs, microbatch slots m < M_g of each group and ranks
j < N_g of a group:

    y[k,g,m,j] = 1  sequence k whole on rank j of microbatch m of group g        (P of eq. 6)
    z[k,g,m]   = 1  sequence k sharded over microbatch m of group g (N_g > 1)    (D of eq. 6)
    u[g,m], hl[g,m,j], hs[g,m]  microbatch used / has local work on j / has sharded work
    ul[g,m]    = 1  the microbatch's sharded work runs in Ulysses, 0 in all-gather (only where both are
               allowed and the group divides the heads; otherwise the group's one mode is implied)
    W[g,m]     the DACP time of the microbatch without its overhead (eq. 2, linearised)
    T[g]       the group's summed microbatch time
    Z >= sum of T[g] over the groups a load holds, for every load; Z is minimised (eq. 8)

Two layouts (``Layout``):

* static (Skrull): G groups of N = cp GPUs, the CP groups of the DP ranks; each load is one group.
* flexible: groups of any sizes on the dp*cp GPUs (the aligned blocks of sizes 1, cp, 2cp, ..., dp*cp
  and whatever groups the warm start uses: groups wider than CP, heterogeneous replicas, one GPU
  alone); each load is one GPU and holds every group that contains it. Its optimum is the optimum over
  all plans made of those groups, and its bound is valid for them.

Times are integers: every coefficient is floored at ``TIME_SCALE`` units per ms (model.py), with
    cF_k = ms_per_flop*FLOPs(S_k), cD_k = ms_per_flop*FLOPs(S_k)/N_g, cC_k = allgather_per_token_ms(N_g, L_g)*S_k,
    cA_k = a2a_per_token_ms(N_g, L_g)*S_k/N_g (Ulysses: each GPU moves T/N tokens, with the K/V copies),
with L_g the link group g's ranks use when the profile has a topology (``Layout.links``; CONTRACT.md:
``(N-1)/N`` of the link's ms per MiB), so a group's coefficients are known when the group is.

The CP mode (all-gather or Ulysses, solver/cp_modes.py) is a decision per microbatch where the cost
model's view chooses between them (``CostModel(choose_modes=...)``, ``CostModel.view_modes``): the
microbatch's communication is the cheaper of the two, ``min(cC.z + fC*hs, cA.z + fA*hs)``, a minimum
the time can only be forced above through a binary ``ul``:

    W >= cC.z + fC*hs + dist - M_C * ul          W >= cA.z + fA*hs + dist - M_A * (1 - ul)

with ``M`` the largest that mode's term can be in one microbatch (its sharded tokens are at most N*C),
and the redundant ``W >= sum_k min(cC_k, cA_k) z_k + min(fC, fA) hs + dist`` for a relaxation that
does not lean on the big-M. A group where only one mode runs has that mode's constraint alone; a group
no allowed mode runs (Ulysses alone on a group not dividing the heads) shards nothing. So the optimum and
the bound are over plans whose microbatches each run their cheaper allowed mode, which is how the plan
runs (``planning.with_modes`` assigns that mode after the solve).

With the profile's ``overlap`` (solver/cost.py, "Overlap"), W also meets, per GPU j and mode, what the
worker waits for when it overlaps each direction on its own: ``max(H_f, A_f) + max(H_b, A_b)`` is the
largest of four sums, each one row (``_time_comm``: both directions communication-bound; ``_time_local``:
both compute-bound; ``_time_directions``: one of each), so no variable per direction is needed.

Memory per GPU is eq. 7 in integers, ``N*local_j + T <= N*C``, exact. With the gathered K/V
(CONTRACT.md; ``CostModel.gathered_kv_tokens``, r = p/q) an all-gather microbatch also needs
``local_j + ceil(T/N) + ceil(r*a*T/b) <= C``, with ``a/b = CostModel.gathered_kv_factor(N)`` (``(N-1)/N``
by the contract, ``(2N+1)/(2N)`` for a profile whose worker keeps key prefixes; N divides b, m = b/N), which
holds when (both ceilings bounded by ``ceil(x/y) <= (x + y - 1)/y``)

    q*b*local_j + (q*m + p*a)*T + (q*m*(N-1) + q*b - 1)*hs - M_K * ul <= q*b*C

(``ul`` only where the microbatch may run Ulysses, which keeps no gathered K/V; ``M_K`` makes the row
redundant then). r is taken as p/q exactly where q <= ``KV_DENOMINATOR``, else rounded up to a multiple of
1/KV_DENOMINATOR: the row is never looser than the rule, at most a few tokens stricter.

Microbatch slots: a plan no worse than the hint's objective UB runs at most ``floor(UB / microbatch_ms)``
microbatches on any load (each costs at least microbatch_ms), and at most K; ``M_g`` is the smaller of
the two, plus one slot against the flooring of coefficients (and at least the hint's count on g).

Symmetry breaking: interchangeable static groups by time, microbatches of a group by time, ranks of a
microbatch by local tokens, and (flexible layouts) the own groups of interchangeable GPUs by time
(``interchangeable_singles``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from skrull.solver.cost import CostModel
from skrull.solver.cp_modes import ALLGATHER, ULYSSES
from skrull.solver.ilp.model import TIME_SCALE, LinearModel
from skrull.solver.profile import OVERLAP_LOCAL_ATTENTION, Topology

#: Largest denominator of the gathered-K/V ratio in the memory rows (module docstring).
KV_DENOMINATOR = 4096

#: One microbatch of a group, as sequence ids: (local ids per rank of the group, sharded ids).
GroupMicrobatch = tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class Layout:
    """The model's groups (``sizes[g]`` GPUs each) and loads (``loads[l]``: the groups adding to load l).
    The objective is the slowest load."""

    sizes: tuple[int, ...]
    loads: tuple[tuple[int, ...], ...]
    #: per group, the link its ranks use (``CostModel.link_of``); empty: no topology (or aligned groups)
    links: tuple[str | None, ...] = ()

    @classmethod
    def static(cls, num_groups: int, group_size: int, links: Sequence[str | None] | None = None) -> Layout:
        """``num_groups`` groups of ``group_size``; ``links[g]`` the link of group g's ranks (topology)."""
        return cls(
            sizes=(group_size,) * num_groups, loads=tuple((g,) for g in range(num_groups)), links=tuple(links or ())
        )

    @classmethod
    def of_groups(cls, groups: Sequence[Sequence[int]], num_gpus: int, topology: Topology | None = None) -> Layout:
        """Groups given by their GPU ranks; one load per GPU (its groups in order), each group priced on the
        link its ranks use under ``topology`` (the cost model's). One pass over the groups' ranks: asking every GPU
        whether it is in every group took minutes at 65,536 GPUs."""
        per_gpu: list[list[int]] = [[] for _ in range(num_gpus)]
        for g, ranks in enumerate(groups):
            for gpu in sorted(set(ranks)):
                if 0 <= gpu < num_gpus:
                    per_gpu[gpu].append(g)
        links = () if topology is None else tuple(topology.link_name(r) for r in groups)
        return cls(sizes=tuple(len(r) for r in groups), loads=tuple(tuple(load) for load in per_gpu), links=links)

    def link(self, g: int) -> str | None:
        """The link group g is priced on (None: no topology, or the link of an aligned group of its size)."""
        return self.links[g] if self.links else None

    @property
    def is_static(self) -> bool:
        """Each load is one group of its own (groups never share a GPU)."""
        return all(len(load) == 1 for load in self.loads) and len(self.loads) == len(self.sizes)


@dataclass(slots=True)
class BuiltModel:
    model: LinearModel
    seq_ids: tuple[int, ...]
    layout: Layout
    slots: tuple[int, ...]
    y: dict[tuple[int, int, int, int], int]
    z: dict[tuple[int, int, int], int]
    objective_var: int

    @property
    def num_groups(self) -> int:
        return len(self.layout.sizes)

    @property
    def num_slots(self) -> int:
        return max(self.slots, default=0)

    def decode(self, values: Sequence[int]) -> list[list[GroupMicrobatch]]:
        """Per group, its used microbatches (slot order) as (local ids per rank, sharded ids)."""
        sizes = self.layout.sizes
        slots: dict[tuple[int, int], tuple[list[list[int]], list[int]]] = {}
        for (k, g, m, j), v in self.y.items():
            if values[v] > 0.5:
                slots.setdefault((g, m), ([[] for _ in range(sizes[g])], []))[0][j].append(self.seq_ids[k])
        for (k, g, m), v in self.z.items():
            if values[v] > 0.5:
                slots.setdefault((g, m), ([[] for _ in range(sizes[g])], []))[1].append(self.seq_ids[k])
        out: list[list[GroupMicrobatch]] = [[] for _ in range(self.num_groups)]
        for (g, _m), (local, sharded) in sorted(slots.items()):
            out[g].append((tuple(tuple(sorted(ids)) for ids in local), tuple(sorted(sharded))))
        return out


@dataclass(frozen=True, slots=True)
class _Comm:
    """One mode's communication in a group: per-sequence coefficients, the fixed cost, and ``big_m``, the
    most ``coeffs . z + fixed + dist`` can be in one microbatch (what switching the mode off must cancel)."""

    mode: str
    coeffs: tuple[int, ...]
    fixed: int
    big_m: int
    #: with the profile's ``overlap``: the part of ``coeffs`` / ``fixed`` that runs after the attention,
    #: hidden behind nothing (``ulysses_exposed`` of a Ulysses all-to-all); empty: none
    exposed: tuple[int, ...] = ()
    exposed_fixed: int = 0
    #: with the profile's ``overlap``: what a GPU waits for when one direction's communication outlasts what
    #: hides it and the other's does not (solver/cost.py, "Overlap"): ``H_f + X`` (``fwd``) and ``H_b + X``
    #: (``bwd``) per sequence and fixed; empty: no overlap
    fwd: tuple[int, ...] = ()
    fwd_fixed: int = 0
    bwd: tuple[int, ...] = ()
    bwd_fixed: int = 0


@dataclass(frozen=True, slots=True)
class _Coeffs:
    local: tuple[int, ...]
    dist: tuple[int, ...]
    comp_fixed: int
    microbatch: int
    #: the modes a microbatch of this group may shard in (``CostModel.view_modes``); none: it shards nothing
    comms: tuple[_Comm, ...]
    #: with ``overlap.with == local_attention``: each sequence's local compute that is not attention
    #: (``ms_per_flop * flops_per_token * S``), which runs after the hidden communication; empty: none
    lin: tuple[int, ...] = ()
    #: with the profile's ``overlap`` (N > 1): each sequence's local compute less forward's (``rest_fwd``) or
    #: backward's (``rest_bwd``) share of what hides communication, ``T_comp(S) - A_f(S)``, and of the fixed
    #: cost (``CostModel.hiding_split_ms``, ``hiding_fixed_split_ms``); empty: no overlap
    rest_fwd: tuple[int, ...] = ()
    rest_fwd_fixed: int = 0
    rest_bwd: tuple[int, ...] = ()
    rest_bwd_fixed: int = 0

    @property
    def shards(self) -> bool:
        return bool(self.comms)

    def comm_time(self, k_ids: Sequence[int]) -> int:
        """The cheapest mode's communication of sharding these sequences (model indices)."""
        assert self.comms, "sharding on a group no allowed mode runs (a hint the planner should not make)"
        return min(sum(c.coeffs[k] for k in k_ids) + c.fixed for c in self.comms)

    def mode_times(self, local: Sequence[Sequence[int]], sharded: Sequence[int]) -> list[int]:
        """W of a microbatch (model indices) in each of ``comms``' modes (one entry when nothing is sharded):
        ``max_j max(C + L_j, T_local_j + X, H_f + X + T_local_j - A_f, H_b + X + T_local_j - A_b) + dist``
        (``C`` the mode's communication, ``X`` its exposed part, ``L_j`` GPU j's non-attention local compute
        with ``lin``, else 0; the last two with ``overlap``, one direction's communication against the
        other's compute; the plain form without overlap)."""
        dist = sum(self.dist[k] for k in sharded) + (self.comp_fixed if sharded else 0)
        comms = self.comms if sharded else ()
        if sharded:
            assert comms, "sharding on a group no allowed mode runs (a hint the planner should not make)"
        out = []
        for c in comms or (None,):
            comm = sum(c.coeffs[k] for k in sharded) + c.fixed if c is not None else 0
            exposed = sum(c.exposed[k] for k in sharded) + c.exposed_fixed if c is not None and c.exposed else 0
            worst = comm + dist if sharded else 0
            for ks in local:
                if not ks:
                    continue
                own = sum(self.local[k] for k in ks) + self.comp_fixed
                worst = max(worst, own + exposed + dist)
                if sharded and self.lin:
                    worst = max(worst, comm + sum(self.lin[k] for k in ks) + self.comp_fixed + dist)
                if sharded and c is not None and c.fwd and self.rest_fwd:
                    fwd = sum(c.fwd[k] for k in sharded) + c.fwd_fixed
                    bwd = sum(c.bwd[k] for k in sharded) + c.bwd_fixed
                    rest_fwd = sum(self.rest_fwd[k] for k in ks) + self.rest_fwd_fixed
                    rest_bwd = sum(self.rest_bwd[k] for k in ks) + self.rest_bwd_fixed
                    worst = max(worst, fwd + rest_fwd + dist, bwd + rest_bwd + dist)
            out.append(worst)
        return out


def _coefficients(
    lengths: Sequence[int], model: CostModel, group_size: int, bucket_tokens: int, link: str | None = None
) -> _Coeffs:
    p = model.profile
    ms_per_flop = p.compute.ms_per_tflop / 1e12
    floor = math.floor
    dist = tuple(floor(TIME_SCALE * ms_per_flop * model.flops(s) / group_size) for s in lengths)
    comp_fixed = floor(TIME_SCALE * p.compute.fixed_ms)
    # a microbatch shards at most N*C tokens (memory), and FLOPs(S) is superadditive, so its sharded
    # compute is at most FLOPs(N*C)/N: the big-M of each mode's time-comm row
    capacity = group_size * bucket_tokens
    dist_max = min(sum(dist), math.ceil(TIME_SCALE * ms_per_flop * model.flops(capacity) / group_size)) + comp_fixed
    c = model.coefficients
    overlap = model.profile.overlap
    exposed_share = overlap.ulysses_exposed if overlap is not None else 0.0
    lin: tuple[int, ...] = ()
    directions = overlap is not None and group_size > 1
    rest_fwd: tuple[int, ...] = ()
    rest_bwd: tuple[int, ...] = ()
    rest_fwd_fixed = rest_bwd_fixed = 0
    if directions:
        splits = [model.hiding_split_ms(s) for s in lengths]
        local_ms = [ms_per_flop * model.flops(s) for s in lengths]
        rest_fwd = tuple(floor(TIME_SCALE * (t - fb[0])) for t, fb in zip(local_ms, splits, strict=True))
        rest_bwd = tuple(floor(TIME_SCALE * (t - fb[1])) for t, fb in zip(local_ms, splits, strict=True))
        fixed_fwd, fixed_bwd = model.hiding_fixed_split_ms()
        rest_fwd_fixed = floor(TIME_SCALE * (p.compute.fixed_ms - fixed_fwd))
        rest_bwd_fixed = floor(TIME_SCALE * (p.compute.fixed_ms - fixed_bwd))
    if overlap is not None and overlap.scope == OVERLAP_LOCAL_ATTENTION and group_size > 1:
        lin = tuple(floor(TIME_SCALE * ms_per_flop * p.compute.flops_per_token * s) for s in lengths)
    # with ``lin``, a mode's time-comm rows also carry a GPU's non-attention local compute (at most a bucket)
    lin_max = math.ceil(TIME_SCALE * ms_per_flop * p.compute.flops_per_token * bucket_tokens) + comp_fixed if lin else 0
    per_token = {
        ALLGATHER: c.allgather_per_token_ms(group_size, link) if group_size > 1 else c.comm_ms_per_token,
        ULYSSES: c.a2a_per_token_ms(group_size, link) / group_size,
    }
    fixed = {ALLGATHER: c.comm_fixed_ms, ULYSSES: c.a2a_fixed_ms}
    comms = []
    for mode in model.view_modes(group_size):
        coeffs = tuple(floor(TIME_SCALE * per_token[mode] * s) for s in lengths)
        fixed_units = floor(TIME_SCALE * fixed[mode])
        most = min(sum(coeffs), math.ceil(TIME_SCALE * per_token[mode] * capacity))
        exposed: tuple[int, ...] = ()
        exposed_fixed = 0
        share = exposed_share if mode == ULYSSES else 0.0
        if share > 0:
            exposed = tuple(floor(TIME_SCALE * share * per_token[mode] * s) for s in lengths)
            exposed_fixed = floor(TIME_SCALE * share * fixed[mode])
        sides: dict[str, tuple[tuple[int, ...], int]] = {}
        if directions:
            # forward's (backward's) hidden share H_f = h (1 - e) C (H_b), plus the exposed X = e C
            h = model.hidden_forward_share(group_size, mode)
            for side, part in (("fwd", h), ("bwd", 1.0 - h)):
                k_side = part * (1.0 - share) + share
                sides[side] = (
                    tuple(floor(TIME_SCALE * k_side * per_token[mode] * s) for s in lengths),
                    floor(TIME_SCALE * k_side * fixed[mode]),
                )
        comms.append(
            _Comm(
                mode=mode,
                coeffs=coeffs,
                fixed=fixed_units,
                big_m=most + fixed_units + dist_max + lin_max,
                exposed=exposed,
                exposed_fixed=exposed_fixed,
                fwd=sides["fwd"][0] if sides else (),
                fwd_fixed=sides["fwd"][1] if sides else 0,
                bwd=sides["bwd"][0] if sides else (),
                bwd_fixed=sides["bwd"][1] if sides else 0,
            )
        )
    return _Coeffs(
        local=tuple(floor(TIME_SCALE * ms_per_flop * model.flops(s)) for s in lengths),
        dist=dist,
        comp_fixed=comp_fixed,
        microbatch=floor(TIME_SCALE * p.microbatch_ms),
        comms=tuple(comms),
        lin=lin,
        rest_fwd=rest_fwd,
        rest_fwd_fixed=rest_fwd_fixed,
        rest_bwd=rest_bwd,
        rest_bwd_fixed=rest_bwd_fixed,
    )


def scaled_microbatch_time(mb: GroupMicrobatch, index: dict[int, int], c: _Coeffs) -> int:
    """The model's (floored) time of one microbatch: overhead + W, its sharded work in the cheapest mode."""
    local, sharded = mb
    times = c.mode_times([[index[i] for i in ids] for ids in local], [index[i] for i in sharded])
    return c.microbatch + min(times)


@dataclass(frozen=True, slots=True)
class _Data:
    """Everything the constraint families read: sequences, layout, slots, coefficients, bounds."""

    ids: tuple[int, ...]
    index: dict[int, int]
    sizes: tuple[int, ...]  # tokens per sequence (model order)
    layout: Layout
    slots: tuple[int, ...]
    coeffs: tuple[_Coeffs, ...]  # per group (by its size)
    bucket: int
    offsets: tuple[int, ...]  # per load
    time_cap: int
    kv: tuple[int, int] | None = None  # the gathered-K/V ratio p/q (rounded up), None without one
    kv_factors: dict[int, tuple[int, int]] | None = None  # per group size, CostModel.gathered_kv_factor

    def cells(self) -> list[tuple[int, int]]:
        """Every (group, slot)."""
        return [(g, m) for g in range(len(self.layout.sizes)) for m in range(self.slots[g])]

    def shards(self, g: int) -> bool:
        """Whether group g may shard (two or more GPUs and a mode that runs on them)."""
        return self.layout.sizes[g] > 1 and self.coeffs[g].shards


@dataclass(slots=True)
class _Vars:
    y: dict[tuple[int, int, int, int], int]
    z: dict[tuple[int, int, int], int]
    used: dict[tuple[int, int], int]
    has_local: dict[tuple[int, int, int], int]
    has_shard: dict[tuple[int, int], int]
    ulysses: dict[tuple[int, int], int]
    work: dict[tuple[int, int], int]
    totals: list[int]
    objective: int


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
    layout: Layout | None = None,
) -> BuiltModel:
    """Build the joint model for ``seq_ids``, warm-started from ``hint`` (``hint[g]``: group g's
    microbatches; ``lengths`` indexed by global sequence id).

    ``layout`` defaults to the static one (``num_groups`` groups of ``group_size``). ``offsets_ms[l]``
    is time load l already spends outside the model (LNS neighbourhoods of a larger plan). ``max_slots``
    caps the slots below the valid bound: the model is then a restriction (LNS uses it) and its optimum
    no longer a proof for the whole problem.
    """
    layout = layout or Layout.static(num_groups, group_size)
    data = _prepare(seq_ids, lengths, layout, cost, hint, offsets_ms, max_slots)
    twins = interchangeable_singles(layout, data.offsets) if symmetry_breaking and not layout.is_static else []
    if twins:  # the hint in the twins' order; its slots per group follow it
        hint = _sort_twins(data, hint, twins)
        data = _prepare(seq_ids, lengths, layout, cost, hint, offsets_ms, max_slots)
    m_ = LinearModel()
    v = _variables(m_, data)
    _assignment(m_, data, v)
    for g, m in data.cells():
        _memory(m_, data, v, g, m)
        _time_local(m_, data, v, g, m)
        _time_comm(m_, data, v, g, m)
        _time_directions(m_, data, v, g, m)
        _indicators(m_, data, v, g, m)
        _redundant_microbatch(m_, data, v, g, m)
    _loads(m_, data, v)
    symmetric_groups = (
        layout.is_static
        and len(set(layout.sizes)) <= 1
        and len(set(data.offsets)) <= 1
        and len(set(layout.links)) <= 1  # groups on different links are not interchangeable
    )
    if symmetry_breaking:
        _symmetry(m_, data, v, groups=symmetric_groups)
        for run in twins:
            for a, b in itertools.pairwise(run):
                m_.add({v.totals[a]: 1, v.totals[b]: -1}, family="symmetry-gpus", lower=0)
    # Redundant: no plan beats the reference lower bound, less what flooring the coefficients can take off a
    # load's objective (``flooring_slack``: else the warm start, and the optimum, could fall below it)
    floor_units = math.floor(lower_bound_ms * TIME_SCALE) - flooring_slack(data)
    m_.add({v.objective: 1}, family="redundant-lower-bound", lower=max(0, floor_units))
    m_.objective = {v.objective: 1}
    built = BuiltModel(
        model=m_, seq_ids=data.ids, layout=layout, slots=data.slots, y=v.y, z=v.z, objective_var=v.objective
    )
    m_.hint = _hint_values(
        data, v, m_.num_vars, hint, symmetric=symmetry_breaking, sort_groups=symmetry_breaking and symmetric_groups
    )
    return built


def flooring_slack(d: _Data) -> int:
    """Units by which a load's objective in the model can fall below its time in ms x ``TIME_SCALE``: every
    coefficient is floored (less than one unit each). A microbatch's time is its floored overhead plus the
    largest of its rows (time-local: the fixed cost, each local sequence, the sharded compute's fixed cost
    and sequences; time-comm: the fixed costs and each sharded sequence twice, compute and communication),
    so it loses less than ``4 + 2 * (its sequences)`` units; a load, less than ``1`` (its offset) plus that
    over its slots, each sequence in at most one of them."""
    sequences = len(d.ids)
    return max(
        (1 + sum(4 * d.slots[g] for g in load) + 2 * sequences for load in d.layout.loads),
        default=0,
    )


def interchangeable_singles(layout: Layout, offsets: Sequence[int]) -> list[list[int]]:
    """Runs of single-GPU groups whose GPUs are interchangeable, each in GPU order (runs of two or more).

    GPUs a and b are interchangeable when both have a group of their own, every wider group holds both
    or neither, and no time outside the model tells them apart (equal offsets). Swapping them then maps
    the model's groups onto themselves: a shared group's microbatches only permute their ranks, which
    changes no time (a microbatch charges its slowest GPU to all of them) and keeps every rank within
    its bucket, and the two loads, ``T[own group] + sum of the shared groups' T``, trade places. So
    ordering the own groups' times ``T[a] >= T[b]`` (a < b) within a run removes only copies of plans,
    and together with the other orders (microbatches within a group, ranks within a microbatch, which
    never move a group's total) keeps one copy of every plan.
    """
    by_key: dict[tuple[frozenset[int], int], list[int]] = {}
    for gpu, load in enumerate(layout.loads):
        own = [g for g in load if layout.sizes[g] == 1]
        if len(own) != 1:
            continue
        shared = frozenset(g for g in load if layout.sizes[g] > 1)
        by_key.setdefault((shared, offsets[gpu]), []).append(own[0])
    return [run for run in by_key.values() if len(run) > 1]


def _sort_twins(
    d: _Data, hint: Sequence[Sequence[GroupMicrobatch]], twins: Sequence[Sequence[int]]
) -> list[Sequence[GroupMicrobatch]]:
    """The hint with each run's own groups given their microbatches slowest first (``symmetry-gpus``):
    interchangeable GPUs trade loads, so the objective is the hint's."""
    out = list(hint) + [[] for _ in range(len(d.layout.sizes) - len(hint))]
    for run in twins:
        lists = sorted(
            (out[g] for g in run),
            key=lambda grp: -sum(scaled_microbatch_time(mb, d.index, d.coeffs[run[0]]) for mb in grp),
        )
        for g, grp in zip(run, lists, strict=True):
            out[g] = grp
    return out


def _prepare(
    seq_ids: Sequence[int],
    lengths: Sequence[int],
    layout: Layout,
    cost: CostModel,
    hint: Sequence[Sequence[GroupMicrobatch]],
    offsets_ms: Sequence[float] | None,
    max_slots: int | None,
) -> _Data:
    """Coefficients, and slots bounded by the hint's objective (module docstring)."""
    ids = tuple(seq_ids)
    index = {seq: k for k, seq in enumerate(ids)}
    sizes = tuple(lengths[i] for i in ids)
    kinds = [(n, layout.link(g)) for g, n in enumerate(layout.sizes)]  # a group's size and link price it
    by_kind = {kind: _coefficients(sizes, cost, kind[0], cost.bucket_tokens, kind[1]) for kind in set(kinds)}
    coeffs = tuple(by_kind[kind] for kind in kinds)
    offsets = tuple(math.floor(o * TIME_SCALE) for o in (offsets_ms or [0.0] * len(layout.loads)))
    group_time = [sum(scaled_microbatch_time(mb, index, coeffs[g]) for mb in grp) for g, grp in enumerate(hint)]
    group_time += [0] * (len(layout.sizes) - len(group_time))
    load_times = [off + sum(group_time[g] for g in load) for off, load in zip(offsets, layout.loads, strict=True)]
    upper = max(load_times, default=0)
    room = upper - min(offsets, default=0)
    microbatch = coeffs[0].microbatch if coeffs else 0
    bound = len(ids) if microbatch == 0 else min(len(ids), room // microbatch + 1)
    if max_slots is not None:
        bound = min(bound, max_slots)
    hinted = [len(grp) for grp in hint] + [0] * (len(layout.sizes) - len(hint))
    slots = tuple(max(bound, hinted[g], 1) for g in range(len(layout.sizes)))
    return _Data(
        ids,
        index,
        sizes,
        layout,
        slots,
        coeffs,
        cost.bucket_tokens,
        offsets,
        upper if upper > 0 else 1,
        _kv_ratio(cost),
        {n: cost.gathered_kv_factor(n) for n in set(layout.sizes)},
    )


def _kv_ratio(cost: CostModel) -> tuple[int, int] | None:
    """The gathered-K/V ratio r as ``(p, q)`` with ``q <= KV_DENOMINATOR``, never below r; None for r = 0."""
    ratio = cost.gathered_kv_ratio
    if not ratio:
        return None
    if ratio.denominator <= KV_DENOMINATOR:
        return ratio.numerator, ratio.denominator
    return -(-ratio.numerator * KV_DENOMINATOR // ratio.denominator), KV_DENOMINATOR


def _variables(m_: LinearModel, d: _Data) -> _Vars:
    v = _Vars(y={}, z={}, used={}, has_local={}, has_shard={}, ulysses={}, work={}, totals=[], objective=-1)
    for g, m in d.cells():
        n = d.layout.sizes[g]
        v.used[g, m] = m_.binary(f"u[{g},{m}]")
        v.work[g, m] = m_.var(f"W[{g},{m}]", 0, d.time_cap)
        for j in range(n):
            v.has_local[g, m, j] = m_.binary(f"hl[{g},{m},{j}]")
        if d.shards(g):
            v.has_shard[g, m] = m_.binary(f"hs[{g},{m}]")
            if len(d.coeffs[g].comms) > 1:
                v.ulysses[g, m] = m_.binary(f"ul[{g},{m}]")
        for k in range(len(d.ids)):
            for j in range(n):
                v.y[k, g, m, j] = m_.binary(f"y[{k},{g},{m},{j}]")
            if d.shards(g):
                v.z[k, g, m] = m_.binary(f"z[{k},{g},{m}]")
    v.totals = [m_.var(f"T[{g}]", 0, d.time_cap) for g in range(len(d.layout.sizes))]
    v.objective = m_.var("Z", 0, d.time_cap)
    return v


def _assignment(m_: LinearModel, d: _Data, v: _Vars) -> None:
    """Every sequence exactly once, whole on one GPU or sharded over one microbatch (eqs. 6, 9)."""
    rows: list[dict[int, int]] = [{} for _ in d.ids]
    for key, var in [*v.y.items(), *v.z.items()]:
        rows[key[0]][var] = 1
    for row in rows:
        m_.add(row, family="assign", lower=1, upper=1)


def _memory(m_: LinearModel, d: _Data, v: _Vars, g: int, m: int) -> None:
    """Memory per GPU, exact in integers: N * local tokens + sharded tokens <= N * C (eq. 7); with the
    gathered K/V, an all-gather microbatch's row of the module docstring too."""
    n = d.layout.sizes[g]
    for j in range(n):
        mem = {v.y[k, g, m, j]: n * d.sizes[k] for k in range(len(d.ids))}
        if d.shards(g):
            mem.update({v.z[k, g, m]: d.sizes[k] for k in range(len(d.ids))})
        m_.add(mem, family="memory", upper=n * d.bucket)
    if d.kv is None or not d.shards(g) or ALLGATHER not in (c.mode for c in d.coeffs[g].comms):
        return
    p, q = d.kv  # the gathered K/V of an all-gather microbatch (module docstring)
    assert d.kv_factors is not None
    a, b = d.kv_factors[n]
    per = b // n
    assert per * n == b, (n, b)
    slack = q * per * (n - 1) + q * b - 1
    big = p * a * n * d.bucket + slack
    for j in range(n):
        row = {v.y[k, g, m, j]: q * b * d.sizes[k] for k in range(len(d.ids))}
        row.update({v.z[k, g, m]: (q * per + p * a) * d.sizes[k] for k in range(len(d.ids))})
        row[v.has_shard[g, m]] = slack
        if (g, m) in v.ulysses:
            row[v.ulysses[g, m]] = -big
        m_.add(row, family="memory-gathered-kv", upper=q * b * d.bucket)


def _sharded_compute(d: _Data, v: _Vars, g: int, m: int) -> dict[int, int]:
    """The distributed compute term T_comp(sum sharded FLOPs / N) of a microbatch, as coefficients."""
    if not d.shards(g):
        return {}
    c = d.coeffs[g]
    out = {v.z[k, g, m]: c.dist[k] for k in range(len(d.ids))}
    out[v.has_shard[g, m]] = c.comp_fixed
    return out


def _time_local(m_: LinearModel, d: _Data, v: _Vars, g: int, m: int) -> None:
    """Local compute of each GPU plus the sharded compute after it (eqs. 2, 3, 4); with the profile's
    ``overlap``, a Ulysses microbatch also waits for the exposed part of its all-to-all (``X``): one more row
    per GPU, switched off by the mode decision where both modes run."""
    c = d.coeffs[g]
    exposed = [x for x in c.comms if x.exposed] if d.shards(g) else []
    for j in range(d.layout.sizes[g]):
        lhs = {v.work[g, m]: 1, v.has_local[g, m, j]: -c.comp_fixed}
        for k in range(len(d.ids)):
            lhs[v.y[k, g, m, j]] = -c.local[k]
        for var, coef in _sharded_compute(d, v, g, m).items():
            lhs[var] = lhs.get(var, 0) - coef
        m_.add(lhs, family="time-local", lower=0)
        for x in exposed:
            row = dict(lhs)
            row[v.has_shard[g, m]] = row.get(v.has_shard[g, m], 0) - x.exposed_fixed
            for k in range(len(d.ids)):
                row[v.z[k, g, m]] = row.get(v.z[k, g, m], 0) - x.exposed[k]
            if len(c.comms) == 1:
                m_.add(row, family="time-local-exposed", lower=0)
            else:  # W - ... - M (1 - ul) >= 0: holds when the microbatch runs Ulysses
                row[v.ulysses[g, m]] = -x.big_m
                m_.add(row, family="time-local-exposed", lower=-x.big_m)


def _time_comm(m_: LinearModel, d: _Data, v: _Vars, g: int, m: int) -> None:
    """Communication of the sharded tokens, overlapped with local compute (eqs. 2, 5), in the microbatch's
    mode: each mode's row holds unless the mode decision ``ul`` switches it off (module docstring). With
    ``overlap.with == local_attention`` the communication hides only behind the attention, so each GPU's
    row adds its non-attention local compute (``lin`` and the fixed cost when it computes locally)."""
    if not d.shards(g):
        return
    c = d.coeffs[g]
    comms = c.comms
    dist = _sharded_compute(d, v, g, m)

    def row(coeffs: Sequence[int], fixed: int, j: int | None) -> dict[int, int]:
        lhs = {v.work[g, m]: 1, v.has_shard[g, m]: -fixed}
        for k in range(len(d.ids)):
            lhs[v.z[k, g, m]] = -coeffs[k]
        for var, coef in dist.items():
            lhs[var] = lhs.get(var, 0) - coef
        if j is not None:
            lhs[v.has_local[g, m, j]] = -c.comp_fixed
            for k in range(len(d.ids)):
                lhs[v.y[k, g, m, j]] = -c.lin[k]
        return lhs

    for j in range(d.layout.sizes[g]) if c.lin else (None,):
        if len(comms) == 1:
            m_.add(row(comms[0].coeffs, comms[0].fixed, j), family="time-comm", lower=0)
            continue
        ag, ul = comms  # CP_MODES order: all-gather, Ulysses
        # all-gather's row, off when the microbatch runs Ulysses (ul = 1)
        m_.add({**row(ag.coeffs, ag.fixed, j), v.ulysses[g, m]: ag.big_m}, family="time-comm", lower=0)
        # Ulysses's row, off when it runs all-gather (ul = 0): W - ... - M (1 - ul) >= 0
        m_.add({**row(ul.coeffs, ul.fixed, j), v.ulysses[g, m]: -ul.big_m}, family="time-comm", lower=-ul.big_m)
        # Redundant: whichever mode runs, its communication is at least the per-sequence cheaper one
        cheapest = [min(a, b) for a, b in zip(ag.coeffs, ul.coeffs, strict=True)]
        m_.add(row(cheapest, min(ag.fixed, ul.fixed), j), family="redundant-time-comm-cheapest", lower=0)


def _time_directions(m_: LinearModel, d: _Data, v: _Vars, g: int, m: int) -> None:
    """With the profile's ``overlap``, the worker overlaps per direction (solver/cost.py, "Overlap"):
    ``max(H_f, A_f) + max(H_b, A_b)`` is the largest of its four sums, two of which ``_time_comm`` (both
    directions communication-bound) and ``_time_local`` (both compute-bound) already bound; the other two
    are a row each per GPU and mode, ``W >= H_f + X + T_local_j - A_f + dist`` and the same backward,
    switched off by the mode decision as ``_time_comm``'s rows are. W, minimised, meets the largest, so the
    model's time is the cost model's (with floored coefficients) and needs no variable per direction."""
    c = d.coeffs[g]
    if not d.shards(g) or not c.rest_fwd:
        return
    dist = _sharded_compute(d, v, g, m)
    comms = c.comms
    for j in range(d.layout.sizes[g]):
        for x in comms:
            for side, fixed, rest, rest_fixed in ((x.fwd, x.fwd_fixed, c.rest_fwd, c.rest_fwd_fixed),
                                                  (x.bwd, x.bwd_fixed, c.rest_bwd, c.rest_bwd_fixed)):  # fmt: skip
                row = {v.work[g, m]: 1, v.has_shard[g, m]: -fixed, v.has_local[g, m, j]: -rest_fixed}
                for k in range(len(d.ids)):
                    row[v.z[k, g, m]] = -side[k]
                    row[v.y[k, g, m, j]] = -rest[k]
                for var, coef in dist.items():
                    row[var] = row.get(var, 0) - coef
                if len(comms) == 1:
                    m_.add(row, family="time-direction", lower=0)
                elif x.mode == ULYSSES:  # W - ... - M (1 - ul) >= 0: holds when the microbatch runs Ulysses
                    row[v.ulysses[g, m]] = -x.big_m
                    m_.add(row, family="time-direction", lower=-x.big_m)
                else:  # off when it runs Ulysses (ul = 1)
                    row[v.ulysses[g, m]] = x.big_m
                    m_.add(row, family="time-direction", lower=0)


def _indicators(m_: LinearModel, d: _Data, v: _Vars, g: int, m: int) -> None:
    """A sequence on GPU j means GPU j computes; sharded work means hs; any work means the slot is used."""
    n = d.layout.sizes[g]
    for j in range(n):
        for k in range(len(d.ids)):
            m_.add({v.y[k, g, m, j]: 1, v.has_local[g, m, j]: -1}, family="link-local", upper=0)
        m_.add({v.has_local[g, m, j]: 1, v.used[g, m]: -1}, family="link-used", upper=0)
    if (g, m) in v.ulysses:  # Ulysses only for a microbatch that shards (one copy of each plan)
        m_.add({v.ulysses[g, m]: 1, v.has_shard[g, m]: -1}, family="link-mode", upper=0)
    if d.shards(g):
        for k in range(len(d.ids)):
            m_.add({v.z[k, g, m]: 1, v.has_shard[g, m]: -1}, family="link-shard", upper=0)
        m_.add({v.has_shard[g, m]: 1, v.used[g, m]: -1}, family="link-used", upper=0)


def _redundant_microbatch(m_: LinearModel, d: _Data, v: _Vars, g: int, m: int) -> None:
    """Redundant cuts: token capacity (eq. 10), the average GPU, and a used slot computes something."""
    n = d.layout.sizes[g]
    c = d.coeffs[g]
    m_.add({v.work[g, m]: 1, v.used[g, m]: -c.comp_fixed}, family="redundant-used-computes", lower=0)
    if n == 1:
        return
    # a used microbatch holds at most N * C tokens
    tokens = {v.y[k, g, m, j]: d.sizes[k] for k in range(len(d.ids)) for j in range(n)}
    tokens.update({v.z[k, g, m]: d.sizes[k] for k in range(len(d.ids)) if (k, g, m) in v.z})
    tokens[v.used[g, m]] = -n * d.bucket
    m_.add(tokens, family="redundant-group-tokens", upper=0)
    # the slowest GPU is no faster than the average GPU (N * W >= all work)
    avg = {v.work[g, m]: n}
    if d.shards(g):
        avg[v.has_shard[g, m]] = -n * c.comp_fixed
    for j in range(n):
        avg[v.has_local[g, m, j]] = -c.comp_fixed
    for k in range(len(d.ids)):
        for j in range(n):
            avg[v.y[k, g, m, j]] = -c.local[k]
        if d.shards(g):
            avg[v.z[k, g, m]] = -n * c.dist[k]
    m_.add(avg, family="redundant-average-gpu", lower=0)


def _loads(m_: LinearModel, d: _Data, v: _Vars) -> None:
    """A group's time is its summed microbatch times; Z is the slowest load (eq. 8)."""
    for g in range(len(d.layout.sizes)):
        total = {v.totals[g]: 1}
        for m in range(d.slots[g]):
            total[v.used[g, m]] = -d.coeffs[g].microbatch
            total[v.work[g, m]] = -1
        m_.add(total, family="group-time", lower=0, upper=0)
    for load, offset in zip(d.layout.loads, d.offsets, strict=True):
        lhs = {v.objective: 1}
        for g in load:
            lhs[v.totals[g]] = -1
        m_.add(lhs, family="objective", lower=offset)


def _symmetry(m_: LinearModel, d: _Data, v: _Vars, *, groups: bool) -> None:
    """Symmetry breaking: interchangeable groups by time, used slots first and by time, ranks by tokens."""
    if groups:
        for g in range(len(d.layout.sizes) - 1):
            m_.add({v.totals[g]: 1, v.totals[g + 1]: -1}, family="symmetry-groups", lower=0)
    for g in range(len(d.layout.sizes)):
        mb = d.coeffs[g].microbatch
        for m in range(d.slots[g] - 1):
            m_.add({v.used[g, m]: 1, v.used[g, m + 1]: -1}, family="symmetry-microbatches", lower=0)
            m_.add(
                {v.work[g, m]: 1, v.used[g, m]: mb, v.work[g, m + 1]: -1, v.used[g, m + 1]: -mb},
                family="symmetry-microbatches",
                lower=0,
            )
        for m in range(d.slots[g]):
            for j in range(d.layout.sizes[g] - 1):
                order = {v.y[k, g, m, j]: d.sizes[k] for k in range(len(d.ids))}
                for k in range(len(d.ids)):
                    order[v.y[k, g, m, j + 1]] = -d.sizes[k]
                m_.add(order, family="symmetry-cp-ranks", lower=0)


def _hint_values(
    d: _Data,
    v: _Vars,
    num_vars: int,
    hint: Sequence[Sequence[GroupMicrobatch]],
    *,
    symmetric: bool,
    sort_groups: bool,
) -> dict[int, int]:
    """A complete assignment for the hint, permuted to satisfy the symmetry-breaking order."""
    values = dict.fromkeys(range(num_vars), 0)
    tokens = dict(zip(d.ids, d.sizes, strict=True))
    groups = []
    for g, group in enumerate(hint):
        c = d.coeffs[g]
        mbs = []
        for local, sharded in group:
            order = list(range(len(local)))
            if symmetric:
                order.sort(key=lambda j: -sum(tokens[i] for i in local[j]))
            mbs.append((tuple(local[j] for j in order), tuple(sharded)))
        if symmetric:
            mbs.sort(key=lambda mb: -scaled_microbatch_time(mb, d.index, c))
        groups.append(mbs)
    if sort_groups:
        groups.sort(key=lambda grp: -sum(scaled_microbatch_time(mb, d.index, d.coeffs[0]) for mb in grp))
    groups += [[] for _ in range(len(d.layout.sizes) - len(groups))]
    totals = [0] * len(groups)
    for g, group in enumerate(groups):
        for m, mb in enumerate(group):
            totals[g] += _hint_microbatch(d, v, values, g, m, mb)
        values[v.totals[g]] = totals[g]
    values[v.objective] = max(
        (off + sum(totals[g] for g in load) for off, load in zip(d.offsets, d.layout.loads, strict=True)), default=0
    )
    return values


def _hint_microbatch(d: _Data, v: _Vars, values: dict[int, int], g: int, m: int, mb: GroupMicrobatch) -> int:
    """Set one hinted microbatch's variables; its scaled time."""
    local, sharded = mb
    values[v.used[g, m]] = 1
    for j, ids in enumerate(local):
        values[v.has_local[g, m, j]] = 1 if ids else 0
        for i in ids:
            values[v.y[d.index[i], g, m, j]] = 1
    if d.shards(g):
        values[v.has_shard[g, m]] = 1 if sharded else 0
        for i in sharded:
            values[v.z[d.index[i], g, m]] = 1
        if (g, m) in v.ulysses and sharded:  # the cheaper mode (ties: all-gather, CP_MODES order)
            ag_time, ul_time = d.coeffs[g].mode_times(
                [[d.index[i] for i in ids] for ids in local], [d.index[i] for i in sharded]
            )
            values[v.ulysses[g, m]] = int(ul_time < ag_time)
    else:
        assert not sharded, "a hint shards over a group no allowed mode runs"
    t = scaled_microbatch_time(mb, d.index, d.coeffs[g])
    values[v.work[g, m]] = t - d.coeffs[g].microbatch
    return t

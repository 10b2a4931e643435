"""The reference cost model (docs/formats.md; Skrull section 4.1 eqs. 1-7, eq. 8, appendix C).

For a sequence of S tokens (Skrull eq. 13 summed over layers, x3 for forward + backward):

    FLOPs(S)   = flops_per_token * S + flops_per_token_sq * S^2
    T_comp(F)  = ms_per_tflop * F / 1e12 + compute.fixed_ms          (F > 0; 0 for F = 0)   [eq. 14]
    T_comm(T)  = ms_per_mib * T * bytes_per_token / 2^20 + comm.fixed_ms   (T > 0; 0 for T = 0) [eq. 16]

A microbatch on a group of N GPUs, local sequences ``local[j]`` whole on GPU j, ``sharded`` split over
all N (DACP, eqs. 1-5):

    Time = microbatch_ms + max_j [ max(T_comm(sum sharded S), T_comp(sum_{local[j]} FLOPs(S)))
                                   + T_comp(sum_{sharded} FLOPs(S) / N) ]

A microbatch with ``mode == "ulysses"`` (solver/cp_modes.py) has the same form with ``T_comm(T)`` replaced by
``T_a2a(T) = comm_a2a.ms_per_mib * (T/N) * comm_a2a.bytes_per_token / 2^20 + comm_a2a.fixed_ms`` (T > 0),
and needs N to divide ``heads.attention``. Refined where the profile gives ``comm_a2a.kv_bytes_per_token``
(the K/V part of ``bytes_per_token``): a group whose size N does not divide the K/V heads sends
``lcm(kv, N) / kv`` copies of each (worker/dacp.py ``ulysses_kv_copies``), so ``bytes_per_token`` becomes
``bytes_per_token + kv_bytes_per_token * (lcm(kv, N) / kv - 1)``.

Memory (eq. 7), per GPU in real tokens: GPU j holds ``sum_{local[j]} S`` plus the pieces of the sharded
sequences that the split gives it (``solver.sharding``, which deals remainders round-robin over the
microbatch so every GPU holds ``floor(T/N)`` or ``ceil(T/N)`` of the ``T`` sharded tokens). So every GPU
fits exactly when ``sum_{local[j]} S + ceil(T/N) <= bucket_tokens``, which is checked in integers as
``N * sum_{local[j]} S + T <= N * bucket_tokens`` (``fits``), the check every planner makes; the
validator recounts each GPU's real pieces (``bucket_use_tokens``).

Iteration time (eq. 8): the max over GPUs of the summed Time of the microbatches each GPU takes part in.

The model's coefficients are public (``CostModel.coefficients``, one ``CostCoefficients`` in ms per FLOP
and ms per token), and so are the derived terms planners reason with, so no planner re-derives them
from the profile: ``CostCoefficients.sharded_terms(N)`` is ``(a, b, c)`` of a sequence sharded over a
group of N, ``t_N(S) = a*S^2 + b*S`` and the per-microbatch fixed cost ``c`` (Hydraulis's per-strategy
cost, WLB-LLM's document workload), and ``CostModel.iteration_ms`` is the one "iteration time of these
microbatches" (eq. 8 over placements priced with eqs. 1-5).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from skrull.solver.cp_modes import ALLGATHER, CP_MODES, DEFAULT_CP_MODE, ULYSSES, ulysses_divides
from skrull.solver.errors import RequestError
from skrull.solver.plan import Iteration, Microbatch, MicrobatchSpec, Parallel
from skrull.solver.profile import Profile
from skrull.solver.sharding import DEFAULT_SHARDING, max_position_tokens, position_token_counts

MIB = float(2**20)
#: The profile gives compute speed in ms per TFLOP (10^12 FLOPs).
FLOPS_PER_TFLOP = 1e12


class Placement(Protocol):
    """What pricing a microbatch needs: its group and where its sequences sit (a ``MicrobatchSpec`` or a
    ``Microbatch``)."""

    @property
    def ranks(self) -> tuple[int, ...]: ...

    @property
    def local(self) -> tuple[tuple[int, ...], ...]: ...

    @property
    def sharded(self) -> tuple[int, ...]: ...

    @property
    def mode(self) -> str: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class CostCoefficients:
    """The reference model's coefficients in the units planners compute with (docs/formats.md):

    ``ms_per_flop = compute.ms_per_tflop / 1e12``, ``comm_ms_per_token = comm.ms_per_mib *
    comm.bytes_per_token / 2^20``, the fixed costs in ms, the memory bucket in tokens.
    """

    flops_per_token: float
    flops_per_token_sq: float
    ms_per_flop: float
    compute_fixed_ms: float
    comm_ms_per_token: float
    comm_fixed_ms: float
    microbatch_ms: float
    bucket_tokens: int
    #: ``comm_a2a.ms_per_mib * comm_a2a.bytes_per_token / 2^20`` (per token of ``T/N``) and its fixed cost;
    #: ``attention_heads`` 0 when the profile cannot plan ``ulysses``.
    a2a_ms_per_token: float = 0.0
    a2a_fixed_ms: float = 0.0
    attention_heads: int = 0
    #: ``comm_a2a.ms_per_mib * comm_a2a.kv_bytes_per_token / 2^20``: each extra copy of the K/V heads a group
    #: wider than ``kv_heads`` sends (``CommCoeffs``); 0: the contract's plain form
    a2a_kv_ms_per_token: float = 0.0
    kv_heads: int = 1

    def a2a_per_token_ms(self, group_size: int) -> float:
        """All-to-all ms per token of ``T/N`` on a group of N: ``a2a_ms_per_token`` plus the K/V copies,
        ``a2a_kv_ms_per_token * (lcm(kv, N) / kv - 1)``."""
        return a2a_per_token_ms(self.a2a_ms_per_token, self.a2a_kv_ms_per_token, self.kv_heads, group_size)

    def mode_fits(self, group_size: int, mode: str) -> bool:
        """Whether a group of ``group_size`` GPUs can run a microbatch in ``mode`` (Ulysses: the profile
        has ``heads`` and ``comm_a2a`` and N divides the attention heads)."""
        if mode == ALLGATHER:
            return True
        return self.attention_heads > 0 and ulysses_divides(self.attention_heads, group_size)

    def flops(self, num_tokens: int) -> float:
        """``FLOPs(S) = flops_per_token * S + flops_per_token_sq * S^2`` (eq. 13 over layers, x3)."""
        return self.flops_per_token * num_tokens + self.flops_per_token_sq * num_tokens * num_tokens

    def sharded_terms(self, group_size: int, mode: str = DEFAULT_CP_MODE) -> tuple[float, float, float]:
        """``(a, b, c)``: a sequence of S tokens sharded over ``group_size`` GPUs costs each of them
        ``t(S) = a*S^2 + b*S`` (its FLOPs over N, eq. 5, plus its K/V traffic, eq. 16, when N > 1), and a
        microbatch of such sequences costs ``c + sum t(S)`` with ``c = microbatch_ms + compute.fixed_ms +
        comm.fixed_ms * [N > 1]``. Exact for an all-sharded microbatch whose communication is not
        hidden behind local compute (there is none). In ``ulysses`` mode the traffic is the all-to-all's,
        ``a2a_ms_per_token / N`` per token and ``a2a_fixed_ms``."""
        a = self.ms_per_flop * self.flops_per_token_sq / group_size
        b = self.ms_per_flop * self.flops_per_token / group_size
        c = self.microbatch_ms + self.compute_fixed_ms
        if group_size > 1:
            if mode == ULYSSES:
                b += self.a2a_per_token_ms(group_size) / group_size
                c += self.a2a_fixed_ms
            else:
                b += self.comm_ms_per_token
                c += self.comm_fixed_ms
        return a, b, c

    def sharded_ms(self, num_tokens: int, group_size: int, mode: str = DEFAULT_CP_MODE) -> float:
        """``t(S) = a*S^2 + b*S`` of ``sharded_terms``: a sequence's marginal time on each GPU of its group."""
        a, b, _ = self.sharded_terms(group_size, mode)
        return a * num_tokens * num_tokens + b * num_tokens

    def work_ms(self, num_tokens: int) -> float:
        """The plan-independent cost of running one sequence, summed over GPUs: its compute
        ``ms_per_flop * FLOPs(S)`` plus its share ``microbatch_ms * S / bucket_tokens`` of microbatch
        overheads (the average term of the reference lower bound, per sequence)."""
        return self.ms_per_flop * self.flops(num_tokens) + self.microbatch_ms / self.bucket_tokens * num_tokens


def a2a_per_token_ms(base_ms: float, kv_ms: float, kv_heads: int, group_size: int) -> float:
    """Ulysses all-to-all ms per token of ``T/N``: ``base_ms`` (``bytes_per_token``'s) plus ``kv_ms`` per
    extra copy of the K/V heads, ``lcm(kv, N) / kv - 1`` copies (none when N divides kv)."""
    if kv_ms == 0.0 or kv_heads % group_size == 0:
        return base_ms
    return base_ms + kv_ms * (math.lcm(kv_heads, group_size) // kv_heads - 1)


class CostModel:
    """The specification's reference model for one profile and bucket size. Immutable after construction."""

    __slots__ = (
        "_a2a_fixed_ms",
        "_a2a_kv_ms_per_token",
        "_a2a_ms_per_token",
        "_attention_heads",
        "_bound_a2a",
        "_choose_from",
        "_comm_fixed_ms",
        "_comm_ms_per_token",
        "_comp_fixed_ms",
        "_fpt",
        "_fpt_sq",
        "_kv_heads",
        "_mb_ms",
        "_ms_per_flop",
        "bucket_tokens",
        "profile",
    )

    def __init__(
        self,
        profile: Profile,
        *,
        bucket_tokens: int | None = None,
        choose_modes: Sequence[str] | None = None,
        cp_modes: Sequence[str] | None = None,
    ) -> None:
        """``choose_modes``: a planner's view that prices every microbatch in the cheapest of these modes its
        group can run, whatever mode the microbatch names (what ``cheapest_mode`` then assigns); None (the
        reference): every microbatch in its own ``mode``. ``cp_modes``: the modes the request allows (default
        ``choose_modes``, else all-gather only), which the lower bounds must cover: a bound proved for
        all-gather alone is beaten by a plan whose Ulysses all-to-all is cheaper."""
        self.profile = profile
        modes = tuple(m for m in CP_MODES if m in choose_modes) if choose_modes is not None else ()
        self._choose_from: tuple[str, ...] | None = modes if len(modes) > 1 or modes == (ULYSSES,) else None
        self.bucket_tokens = profile.bucket_tokens if bucket_tokens is None else bucket_tokens
        self._fpt = profile.compute.flops_per_token
        self._fpt_sq = profile.compute.flops_per_token_sq
        self._ms_per_flop = profile.compute.ms_per_tflop / FLOPS_PER_TFLOP
        self._comp_fixed_ms = profile.compute.fixed_ms
        self._comm_ms_per_token = profile.comm.ms_per_mib * profile.comm.bytes_per_token / MIB
        self._comm_fixed_ms = profile.comm.fixed_ms
        self._mb_ms = profile.microbatch_ms
        a2a, heads = profile.comm_a2a, profile.heads
        self._a2a_ms_per_token = 0.0 if a2a is None else a2a.ms_per_mib * a2a.bytes_per_token / MIB
        self._a2a_fixed_ms = 0.0 if a2a is None else a2a.fixed_ms
        self._attention_heads = heads.attention if heads is not None and a2a is not None else 0
        self._a2a_kv_ms_per_token = 0.0 if a2a is None else a2a.ms_per_mib * a2a.kv_bytes_per_token / MIB
        self._kv_heads = heads.kv if heads is not None else 1
        allowed = cp_modes if cp_modes is not None else (choose_modes or ())
        self._bound_a2a = ULYSSES in allowed and self._attention_heads > 0

    @property
    def coefficients(self) -> CostCoefficients:
        """The model's coefficients (see ``CostCoefficients``)."""
        return CostCoefficients(
            flops_per_token=self._fpt,
            flops_per_token_sq=self._fpt_sq,
            ms_per_flop=self._ms_per_flop,
            compute_fixed_ms=self._comp_fixed_ms,
            comm_ms_per_token=self._comm_ms_per_token,
            comm_fixed_ms=self._comm_fixed_ms,
            microbatch_ms=self._mb_ms,
            bucket_tokens=self.bucket_tokens,
            a2a_ms_per_token=self._a2a_ms_per_token,
            a2a_fixed_ms=self._a2a_fixed_ms,
            attention_heads=self._attention_heads,
            a2a_kv_ms_per_token=self._a2a_kv_ms_per_token,
            kv_heads=self._kv_heads,
        )

    # --- per-sequence and per-kernel terms -------------------------------------------------------
    def flops(self, num_tokens: int) -> float:
        """Training FLOPs of one sequence of ``num_tokens`` tokens."""
        return self._fpt * num_tokens + self._fpt_sq * num_tokens * num_tokens

    def t_comp_ms(self, flops: float) -> float:
        """Compute time of ``flops`` FLOPs on one GPU; 0 when there is nothing to compute."""
        if flops <= 0.0:
            return 0.0
        return self._ms_per_flop * flops + self._comp_fixed_ms

    def t_comm_ms(self, sharded_tokens: int) -> float:
        """Communication time for the K/V of ``sharded_tokens`` sharded tokens in one microbatch."""
        if sharded_tokens <= 0:
            return 0.0
        return self._comm_ms_per_token * sharded_tokens + self._comm_fixed_ms

    def t_a2a_ms(self, sharded_tokens: int, group_size: int) -> float:
        """Ulysses all-to-all time of ``sharded_tokens`` sharded tokens over ``group_size`` GPUs: each GPU
        sends and receives about ``T / N`` tokens' activations (module doc); 0 when nothing is sharded."""
        if sharded_tokens <= 0:
            return 0.0
        self.check_mode(group_size, ULYSSES)
        per_token = a2a_per_token_ms(self._a2a_ms_per_token, self._a2a_kv_ms_per_token, self._kv_heads, group_size)
        return per_token * sharded_tokens / group_size + self._a2a_fixed_ms

    def comm_ms(self, sharded_tokens: int, group_size: int, mode: str = DEFAULT_CP_MODE) -> float:
        """The communication term of a microbatch sharding ``sharded_tokens`` over ``group_size`` GPUs: in
        ``mode`` (the reference), or in a planner's view (``choose_modes``) the cheapest of its modes the
        group runs (all-gather where none does: such a group is kept from sharding, ``shards_on``)."""
        if self._choose_from is not None and sharded_tokens > 0 and group_size > 1:
            options = [self.t_comm_ms(sharded_tokens)] if ALLGATHER in self._choose_from else []
            if ULYSSES in self._choose_from and self.mode_fits(group_size, ULYSSES):
                options.append(self.t_a2a_ms(sharded_tokens, group_size))
            return min(options) if options else self.t_comm_ms(sharded_tokens)
        if mode == ULYSSES:
            return self.t_a2a_ms(sharded_tokens, group_size)
        return self.t_comm_ms(sharded_tokens)

    def cheapest_comm_ms(self, sharded_tokens: int, max_group_size: int) -> float:
        """A floor on the communication of ``sharded_tokens`` sharded over at most ``max_group_size`` GPUs in
        any mode the request allows: ``T_comm(T)``, or with ``ulysses`` allowed also ``T_a2a`` at the widest
        group (``T/N`` falls with N; whether N divides the heads is ignored, which only lowers the floor)."""
        comm = self.t_comm_ms(sharded_tokens)
        if self._bound_a2a and sharded_tokens > 0 and max_group_size > 1:
            comm = min(comm, self._a2a_ms_per_token * sharded_tokens / max_group_size + self._a2a_fixed_ms)
        return comm

    @property
    def cheapest_comm_fixed_ms(self) -> float:
        """The least fixed cost a microbatch that shards pays for its communication in an allowed mode."""
        return min(self._comm_fixed_ms, self._a2a_fixed_ms) if self._bound_a2a else self._comm_fixed_ms

    def mode_fits(self, group_size: int, mode: str) -> bool:
        """Whether a group of ``group_size`` GPUs can run a microbatch in ``mode`` (``CostCoefficients.mode_fits``)."""
        if mode == ALLGATHER:
            return True
        return self._attention_heads > 0 and ulysses_divides(self._attention_heads, group_size)

    def shards_on(self, group_size: int) -> bool:
        """Whether a microbatch may shard over ``group_size`` GPUs in a mode this view may choose: always in
        all-gather, but with Ulysses alone (``choose_modes=["ulysses"]``) only on a group dividing the heads.
        Planners that pick group sizes (``auto``'s search, ``ilp-flex``) keep to these groups, or the mode
        assignment after planning would find a sharded microbatch no allowed mode runs."""
        if group_size <= 1 or self._choose_from != (ULYSSES,):
            return True
        return self.mode_fits(group_size, ULYSSES)

    def view_modes(self, group_size: int) -> tuple[str, ...]:
        """The modes this view prices a microbatch sharded over ``group_size`` GPUs in (``comm_ms`` takes
        the cheapest): a planner's ``choose_modes`` its group can run, all-gather alone in the reference
        view, none where Ulysses alone is chosen and the group does not divide the heads (``shards_on``).
        The exact model gives each microbatch one mode decision over these (solver/ilp/builder.py)."""
        if group_size <= 1:
            return ()
        if self._choose_from is None:
            return (ALLGATHER,)
        return tuple(m for m in self._choose_from if self.mode_fits(group_size, m))

    def check_mode(self, group_size: int, mode: str) -> None:
        """Refuse a mode this profile or group cannot price, naming what is missing."""
        if mode not in CP_MODES:
            raise RequestError("mode", mode, f"must be one of {', '.join(CP_MODES)}")
        if mode == ALLGATHER:
            return
        if self.profile.heads is None:
            raise RequestError("profile.heads", None, "is required to plan ulysses (attention and kv head counts)")
        if self.profile.comm_a2a is None:
            raise RequestError("profile.comm_a2a", None, "is required to plan ulysses (the all-to-all coefficients)")
        if not ulysses_divides(self._attention_heads, group_size):
            raise RequestError(
                "mode", mode, f"a group of {group_size} GPUs does not divide heads.attention = {self._attention_heads}"
            )

    @property
    def microbatch_overhead_ms(self) -> float:
        return self._mb_ms

    # --- microbatches ----------------------------------------------------------------------------
    def microbatch_time_ms(
        self, local_lengths: Sequence[Sequence[int]], sharded_lengths: Sequence[int], mode: str = DEFAULT_CP_MODE
    ) -> float:
        """DACP time of one microbatch (eqs. 1-5) plus the per-microbatch overhead; in ``ulysses`` mode the
        communication is ``T_a2a`` instead of ``T_comm`` (module doc).

        ``local_lengths[j]`` are the lengths kept whole on the group's j-th GPU; the group size N is
        ``len(local_lengths)``.
        """
        group_size = len(local_lengths)
        assert group_size >= 1, "a microbatch needs at least one GPU"
        sharded_tokens = 0
        sharded_flops = 0.0
        for s in sharded_lengths:
            sharded_tokens += s
            sharded_flops += self._fpt * s + self._fpt_sq * s * s
        comm = self.comm_ms(sharded_tokens, group_size, mode)
        dist = self.t_comp_ms(sharded_flops / group_size)
        worst = 0.0
        idle_counted = False
        for lens in local_lengths:
            if not lens:  # no local work: max(comm, 0) + dist, the same for every such GPU
                if not idle_counted:
                    worst = max(worst, comm + dist)
                    idle_counted = True
                continue
            local_flops = 0.0
            for s in lens:
                local_flops += self._fpt * s + self._fpt_sq * s * s
            local = self.t_comp_ms(local_flops)
            worst = max(worst, max(comm, local) + dist)
        return self._mb_ms + worst

    def bucket_use_tokens(
        self,
        local_lengths: Sequence[Sequence[int]],
        sharded_lengths: Sequence[int],
        *,
        sharding: str = DEFAULT_SHARDING,
    ) -> list[int]:
        """Tokens each GPU of the group really holds: its local sequences plus the pieces that
        ``sharding`` cuts for it (``solver.sharding.position_token_counts``)."""
        pieces = position_token_counts(sharding, sharded_lengths, len(local_lengths))
        return [sum(lens) + piece for lens, piece in zip(local_lengths, pieces, strict=True)]

    def fits(self, local_lengths: Sequence[Sequence[int]], sharded_lengths: Sequence[int]) -> bool:
        """Whether every GPU of the group stays within ``bucket_tokens`` in real tokens, in every sharding
        mode: ``sum local[j] + ceil(T/N) <= bucket`` for every j (eq. 7; module doc)."""
        share = max_position_tokens(sum(sharded_lengths), len(local_lengths))
        limit = self.bucket_tokens - share
        return all(sum(lens) <= limit for lens in local_lengths)

    def spec_time_ms(self, spec: MicrobatchSpec | Placement, lengths: Sequence[int]) -> float:
        """Time of a planner's microbatch, looking lengths up by global sequence id."""
        return self.microbatch_time_ms(
            [[lengths[i] for i in ids] for ids in spec.local], [lengths[i] for i in spec.sharded], spec.mode
        )

    def cheapest_mode(self, spec: MicrobatchSpec | Placement, lengths: Sequence[int], modes: Sequence[str]) -> str:
        """Of ``modes`` that the group can run (``mode_fits``), the one pricing ``spec`` lowest; ties go to
        the first in ``CP_MODES`` order. A microbatch with nothing sharded has no communication: it keeps
        the default, as it does when no mode fits (the validator then names the microbatch)."""
        n = len(spec.ranks)
        if not spec.sharded or n == 1:
            return DEFAULT_CP_MODE
        fitting = [m for m in CP_MODES if m in modes and self.mode_fits(n, m)]
        if not fitting:
            return DEFAULT_CP_MODE
        if len(fitting) == 1:
            return fitting[0]
        local = [[lengths[i] for i in ids] for ids in spec.local]
        sharded = [lengths[i] for i in spec.sharded]
        times = [self.microbatch_time_ms(local, sharded, m) for m in fitting]
        return fitting[min(range(len(fitting)), key=lambda k: (times[k], k))]

    # --- iterations ------------------------------------------------------------------------------
    @staticmethod
    def iteration_time_ms(microbatches: Iterable[tuple[Sequence[int], float]], num_gpus: int) -> float:
        """Max over GPUs of the summed time of the microbatches each takes part in (eq. 8).

        ``microbatches`` yields ``(ranks, time_ms)`` pairs.
        """
        # Summed per group first: a plan reuses few groups, so this costs O(microbatches + sum of distinct
        # group sizes) rather than O(microbatches x group size).
        per_group: dict[tuple[int, ...], float] = {}
        for ranks, time_ms in microbatches:
            key = tuple(ranks)
            per_group[key] = per_group.get(key, 0.0) + time_ms
        per_gpu = [0.0] * num_gpus
        for ranks, time_ms in per_group.items():
            for g in ranks:
                per_gpu[g] += time_ms
        return max(per_gpu, default=0.0)

    def iteration_ms(self, microbatches: Iterable[Placement], lengths: Sequence[int], num_gpus: int) -> float:
        """The iteration time of these microbatches (eq. 8): each priced with eqs. 1-5 (lengths by global
        sequence id), summed per GPU, the slowest GPU."""
        return self.iteration_time_ms(((mb.ranks, self.spec_time_ms(mb, lengths)) for mb in microbatches), num_gpus)

    def price_iteration(
        self, specs: Sequence[MicrobatchSpec], lengths: Sequence[int], *, parallel: Parallel, index: int
    ) -> Iteration:
        """A planner's placements of one iteration, priced: every microbatch (eqs. 1-5), the iteration
        (eq. 8), its lower bound over the sequences it actually runs (valid for every layout) and the
        static-layout bound of the same sequences (docs/formats.md)."""
        ran = [lengths[i] for s in specs for i in s.seq_ids]
        microbatches = tuple(
            Microbatch(
                step=s.step,
                ranks=s.ranks,
                local=s.local,
                sharded=s.sharded,
                estimated_ms=self.spec_time_ms(s, lengths),
                sharding=s.sharding,
                mode=s.mode,
            )
            for s in specs
        )
        return Iteration(
            index=index,
            microbatches=microbatches,
            estimated_ms=self.iteration_time_ms(
                ((mb.ranks, mb.estimated_ms) for mb in microbatches), parallel.num_gpus
            ),
            lower_bound_ms=self.lower_bound_ms(ran, parallel),
            static_bound_ms=self.static_bound_ms(ran, parallel),
        )

    def lower_bound_ms(self, lengths: Sequence[int], parallel: Parallel) -> float:
        """No plan under this model, with any groups, beats this (docs/formats.md "Lower bound"): a plan's
        ``lower_bound_ms``. With ``a = ms_per_tflop / 1e12``, G = dp*cp GPUs and S_max the longest
        (``T_comm`` is ``cheapest_comm_ms``: the all-to-all's over G GPUs too when ``ulysses`` is allowed)::

            max( sum_S a*FLOPs(S) / G + microbatch_ms * sum(S) / (bucket_tokens * G),
                 microbatch_ms + compute.fixed_ms + min( a*FLOPs(S_max)          if S_max <= bucket_tokens,
                                                         T_comm(S_max) + a*FLOPs(S_max) / G ) )

        The first term: the average GPU computes its share of all FLOPs and runs its share of
        microbatches (each holds at most ``bucket_tokens`` per GPU). The second: the longest sequence runs
        somewhere, whole on one GPU or sharded over at most all G GPUs. Zero for an empty batch.
        """
        if not lengths:
            return 0.0
        gpus = parallel.num_gpus
        total_flops = sum(self.flops(s) for s in lengths)
        average = self._ms_per_flop * total_flops / gpus + self._mb_ms * sum(lengths) / (self.bucket_tokens * gpus)
        longest = max(lengths)
        flops_ms = self._ms_per_flop * self.flops(longest)
        options = [self.cheapest_comm_ms(longest, gpus) + flops_ms / gpus] if gpus > 1 else []
        if longest <= self.bucket_tokens:
            options.append(flops_ms)
        single = self._mb_ms + self._comp_fixed_ms + min(options, default=flops_ms)
        return max(average, single)

    def static_bound_ms(self, lengths: Sequence[int], parallel: Parallel) -> float:
        """No plan in Skrull's static layout (every group one CP group of ``cp`` GPUs) beats this; a plan
        with wider groups may (a plan's ``static_bound_ms``, never its ``lower_bound_ms``).

        ``max( sum ms_per_flop*FLOPs(S) / (dp*cp) + microbatch_ms * sum(S) / (bucket*dp*cp),
               ms_per_flop*FLOPs(S_max) / cp + microbatch_ms )``: the average GPU must compute its share
        of all FLOPs and run at least its share of microbatches (each holds <= bucket tokens per GPU),
        and the longest sequence can be spread over at most one CP group. Zero for an empty batch.
        """
        if not lengths:
            return 0.0
        gpus = parallel.num_gpus
        total_flops = sum(self.flops(s) for s in lengths)
        average = self._ms_per_flop * total_flops / gpus + self._mb_ms * sum(lengths) / (self.bucket_tokens * gpus)
        longest = self._ms_per_flop * self.flops(max(lengths)) / parallel.cp + self._mb_ms
        return max(average, longest)

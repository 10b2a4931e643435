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

Gathered K/V (CONTRACT.md "Cluster topology and gathered K/V"): with ``memory.kv_bytes_per_token`` and
``memory.activation_bytes_per_token`` in the profile, an all-gather microbatch also keeps, on every GPU of
its group, the K/V of the rest of the sharded sequences from forward to backward (worker/dacp.py), which
costs ``r = kv / activation`` bucket tokens per gathered token: GPU j fits when
``own_j + r * (N-1)/N * T <= bucket_tokens``. ``own_j`` and the bucket are integers, so this holds exactly
when ``own_j + ceil(r * (N-1) * T / N) <= bucket_tokens``; that ceiling (``gathered_kv_tokens``) is computed
in integers from ``r = p/q`` (the exact fraction of the two floats), so every planner, the validator and
the ILP agree to the token. A Ulysses microbatch keeps no gathered sequence (0), nor does N = 1.
A profile whose ``memory.gathered_kv`` is ``key_prefixes`` says the worker keeps, for each of its own
pieces, the packed key prefix ``[0, end)`` (worker/dacp.py: the varlen kernel's saved keys): under the
zigzag split (2N chunks, GPU j holds j and 2N-1-j) that is ``(2N+1)/(2N) * S`` tokens of a sequence of S,
under the contiguous one ``(j+1)/N * S <= S``; so it is charged ``ceil(r * (2N+1) * T / (2N))``, exact for
zigzag up to the remainder tokens (each dealt token moves later chunk ends by one: below 2N-1 tokens of
K/V per sequence), an upper bound for contiguous. The factor, ``(N-1)/N`` or ``(2N+1)/(2N)``, comes from
one place (``gathered_kv_factor``), which every rule reads.

Iteration time (eq. 8): the max over GPUs of the summed Time of the microbatches each GPU takes part in.

Links (the profile's optional ``topology``; CONTRACT.md "Cluster topology and gathered K/V"): a group whose
ranks sit on one node (``g // gpus_per_node``) uses ``intra_node``, any other ``inter_node``, and on link L

    T_comm(T) = L.allgather_ms_per_mib * (N-1)/N * T * comm.bytes_per_token / 2^20 + comm.fixed_ms
    T_a2a(T)  = L.alltoall_ms_per_mib * (N-1)/N * (T/N) * B_a2a(N) / 2^20 + comm_a2a.fixed_ms

(``(N-1)/N``: each GPU receives the other N-1 shares; busbw as nccl-tests reports it). The link travels with
the group: ``CostModel.link_of(ranks)``, passed as ``link=`` to every time method; a method given only a
group size (a planner reasoning about sizes) prices the link an aligned group of that size uses
(``CostCoefficients.group_link``). Bounds take the cheapest link any group of a size may use
(``CostCoefficients.possible_links``), so they hold whatever the ranks. Without ``topology``, ``comm.ms_per_mib``
and ``comm_a2a.ms_per_mib`` price every group as above.

Overlap (the profile's optional ``overlap``, a refinement the contract allows): the worker (worker/dacp.py)
overlaps each layer's collective with that layer's local attention call only, per direction: forward's
collective (the K/V all-gather; Ulysses' Q/K/V all-to-all) with forward's local attention, backward's (the
dK/dV reduce-scatter; Ulysses' grad-output all-to-all) with backward's; Ulysses' second all-to-all in each
direction (outputs back, dQ/dK/dV back) runs after the attention, behind nothing. For GPU j, with C the
communication, ``X = e*C`` for a Ulysses microbatch (``e = ulysses_exposed``; 0 for all-gather), ``H = C - X``
and ``A_j`` what hides it (``a * flops_per_token_sq * sum_{local[j]} S^2`` with ``with: local_attention``,
``T_comp(local_j)`` with ``local_compute``), each split into a forward and a backward share::

    t_j = max(H_f, A_f) + max(H_b, A_b) + X + (T_comp(local_j) - A_j) + T_comp(sum_{sharded} FLOPs(S) / N)
    H_f = h * H,  H_b = H - H_f;   A_f = alpha * A_attn + lambda * A_rest,  A_b = A_j - A_f

and ``Time = microbatch_ms + max_j t_j``. The shares come from what runs (``hidden_forward_share``,
``hiding_split_ms``):

- ``h``, forward's share of the hidden communication: all-gather 1/2 (the forward all-gather and the
  backward reduce-scatter move the same K/V bytes); Ulysses ``(H_q + 2 H_kv c) / (2 H_q + 2 H_kv c)``
  in head units (forward hides the Q/K/V exchange, ``H_q + 2 H_kv c`` heads with ``c = lcm(kv, N)/kv`` K/V
  copies, backward the grad-output exchange, ``H_q`` heads; the two exposed exchanges are their mirror
  images, so the hidden half is exactly ``ulysses_exposed = 0.5`` of the volume);
- ``alpha = 1 / (1 + 2.5) = 2/7``, forward's share of attention: FlashAttention-2 (Dao 2023, sec. 4;
  ``flops()`` of flash-attention's benchmarks/benchmark_flash_attention.py) counts the backward pass as
  2.5x the forward's FLOPs, five matmuls of the forward's shape (S = QK^T recomputed, dV, dP, dQ, dK) to
  its two (``ATTENTION_BACKWARD_PER_FORWARD``);
- ``lambda = 1 / (1 + 2) = 1/3`` for the rest (``local_compute`` only: ``a * flops_per_token * sum S`` and
  ``compute.fixed_ms``): a dense layer's backward computes dX and dW, two matmuls to the forward's one,
  Skrull eq. 13's x3 (``LINEAR_BACKWARD_PER_FORWARD``).

Since ``max(p, q) + max(r, s) >= max(p + r, q + s)``, it is never below the one-max form
``max(H, A_j) + X + (T_comp(local_j) - A_j) + dist`` (equal when one side wins in both directions), which is
``max(C + T_comp(local_j) - A_j, T_comp(local_j) + X) + dist``, never below the plain form's
``max(C, T_comp(local_j)) + dist``: every lower bound of the plain form holds. The gap is widest at the
crossover ``H = A_j``: for all-gather (``H_f = H_b = H/2`` against ``A_f = 2A/7``, ``A_b = 5A/7``) the
per-direction sum is ``H/2 + 5H/7 = 17H/14`` against the one max's ``H``, which is 3/17 (18%) low before
the rest of the local compute and the sharded compute, which both forms add alike.

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
from fractions import Fraction
from typing import Protocol

from skrull.solver.cp_modes import ALLGATHER, CP_MODES, DEFAULT_CP_MODE, ULYSSES, ulysses_divides
from skrull.solver.errors import RequestError
from skrull.solver.plan import Iteration, Microbatch, MicrobatchSpec, Parallel
from skrull.solver.profile import (
    GATHERED_KV_KEY_PREFIXES,
    INTER_NODE,
    INTRA_NODE,
    OVERLAP_LOCAL_COMPUTE,
    Link,
    Profile,
    Topology,
)
from skrull.solver.sharding import DEFAULT_SHARDING, max_position_tokens, position_token_counts

MIB = float(2**20)
#: The profile gives compute speed in ms per TFLOP (10^12 FLOPs).
FLOPS_PER_TFLOP = 1e12
#: Backward FLOPs of an attention call per forward FLOP: FlashAttention-2 (Dao 2023, sec. 4) counts 2.5, five
#: matmuls of the forward's shape (QK^T recomputed, dV, dP, dQ, dK) to its two (module doc, "Overlap").
ATTENTION_BACKWARD_PER_FORWARD = 2.5
#: Backward FLOPs of a dense layer per forward FLOP: dX and dW, two matmuls to one (Skrull eq. 13's x3).
LINEAR_BACKWARD_PER_FORWARD = 2.0


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
    #: the profile's ``topology`` (None: ``comm_ms_per_token`` and ``a2a_ms_per_token`` price every group) and
    #: the bytes per token its links' ms per MiB multiply (``comm``'s, ``comm_a2a``'s and its K/V part)
    topology: Topology | None = None
    comm_bytes_per_token: float = 0.0
    a2a_bytes_per_token: float = 0.0
    a2a_kv_bytes_per_token: float = 0.0

    def group_link(self, group_size: int, link: str | None = None) -> Link | None:
        """The link a group of ``group_size`` GPUs is priced with: ``link`` by name (``Topology.link_name``
        of its ranks), else the one an aligned group uses (ranks ``0..N-1``: ``intra_node`` when
        ``N <= gpus_per_node``, the group every planner that picks groups prefers); None without topology."""
        topo = self.topology
        if topo is None:
            return None
        if link is None:
            link = INTRA_NODE if group_size <= topo.gpus_per_node else INTER_NODE
        return topo.link(link)

    def possible_links(self, group_size: int) -> tuple[str | None, ...]:
        """Every link a group of ``group_size`` GPUs may use, whatever its ranks: what a bound takes the
        cheapest of (a group wider than a node is always ``inter_node``; a narrower one may be either)."""
        topo = self.topology
        if topo is None:
            return (None,)
        return (INTER_NODE,) if group_size > topo.gpus_per_node else (INTRA_NODE, INTER_NODE)

    def allgather_per_token_ms(self, group_size: int, link: str | None = None) -> float:
        """All-gather ms per sharded token on a group of N: ``comm_ms_per_token`` without topology; with it
        ``L.allgather_ms_per_mib * (N-1)/N * comm.bytes_per_token / 2^20`` (CONTRACT.md)."""
        lk = self.group_link(group_size, link)
        if lk is None:
            return self.comm_ms_per_token
        return lk.allgather_ms_per_mib * (group_size - 1) / group_size * self.comm_bytes_per_token / MIB

    def a2a_per_token_ms(self, group_size: int, link: str | None = None) -> float:
        """All-to-all ms per token of ``T/N`` on a group of N: ``a2a_ms_per_token`` plus the K/V copies,
        ``a2a_kv_ms_per_token * (lcm(kv, N) / kv - 1)``; with topology the link's
        ``alltoall_ms_per_mib * (N-1)/N`` times ``B_a2a(N) / 2^20`` (CONTRACT.md)."""
        lk = self.group_link(group_size, link)
        if lk is None:
            return a2a_per_token_ms(self.a2a_ms_per_token, self.a2a_kv_ms_per_token, self.kv_heads, group_size)
        scale = lk.alltoall_ms_per_mib * (group_size - 1) / group_size / MIB
        return a2a_per_token_ms(
            scale * self.a2a_bytes_per_token, scale * self.a2a_kv_bytes_per_token, self.kv_heads, group_size
        )

    def floor_allgather_per_token_ms(self, group_size: int) -> float:
        """The least ``allgather_per_token_ms`` any group of ``group_size`` GPUs pays (any ranks)."""
        return min(self.allgather_per_token_ms(group_size, lk) for lk in self.possible_links(group_size))

    def floor_a2a_per_token_ms(self, group_size: int) -> float:
        """The least ``a2a_per_token_ms`` any group of ``group_size`` GPUs pays (any ranks)."""
        return min(self.a2a_per_token_ms(group_size, lk) for lk in self.possible_links(group_size))

    def mode_fits(self, group_size: int, mode: str) -> bool:
        """Whether a group of ``group_size`` GPUs can run a microbatch in ``mode`` (Ulysses: the profile
        has ``heads`` and ``comm_a2a`` and N divides the attention heads)."""
        if mode == ALLGATHER:
            return True
        return self.attention_heads > 0 and ulysses_divides(self.attention_heads, group_size)

    def flops(self, num_tokens: int) -> float:
        """``FLOPs(S) = flops_per_token * S + flops_per_token_sq * S^2`` (eq. 13 over layers, x3)."""
        return self.flops_per_token * num_tokens + self.flops_per_token_sq * num_tokens * num_tokens

    def sharded_terms(
        self, group_size: int, mode: str = DEFAULT_CP_MODE, link: str | None = None
    ) -> tuple[float, float, float]:
        """``(a, b, c)``: a sequence of S tokens sharded over ``group_size`` GPUs costs each of them
        ``t(S) = a*S^2 + b*S`` (its FLOPs over N, eq. 5, plus its K/V traffic, eq. 16, when N > 1), and a
        microbatch of such sequences costs ``c + sum t(S)`` with ``c = microbatch_ms + compute.fixed_ms +
        comm.fixed_ms * [N > 1]``. Exact for an all-sharded microbatch whose communication is not
        hidden behind local compute (there is none). In ``ulysses`` mode the traffic is the all-to-all's,
        ``a2a_ms_per_token / N`` per token and ``a2a_fixed_ms``. With topology, the traffic is priced on
        ``link`` (``group_link``: by default the link of an aligned group of N)."""
        a = self.ms_per_flop * self.flops_per_token_sq / group_size
        b = self.ms_per_flop * self.flops_per_token / group_size
        c = self.microbatch_ms + self.compute_fixed_ms
        if group_size > 1:
            if mode == ULYSSES:
                b += self.a2a_per_token_ms(group_size, link) / group_size
                c += self.a2a_fixed_ms
            else:
                b += self.allgather_per_token_ms(group_size, link)
                c += self.comm_fixed_ms
        return a, b, c

    def sharded_ms(
        self, num_tokens: int, group_size: int, mode: str = DEFAULT_CP_MODE, link: str | None = None
    ) -> float:
        """``t(S) = a*S^2 + b*S`` of ``sharded_terms``: a sequence's marginal time on each GPU of its group."""
        a, b, _ = self.sharded_terms(group_size, mode, link)
        return a * num_tokens * num_tokens + b * num_tokens

    def work_ms(self, num_tokens: int) -> float:
        """The plan-independent cost of running one sequence, summed over GPUs: its compute
        ``ms_per_flop * FLOPs(S)`` plus its share ``microbatch_ms * S / bucket_tokens`` of microbatch
        overheads (the average term of the reference lower bound, per sequence)."""
        return self.ms_per_flop * self.flops(num_tokens) + self.microbatch_ms / self.bucket_tokens * num_tokens


def gathered_kv_fraction(profile: Profile) -> tuple[int, int]:
    """``r = kv_bytes_per_token / activation_bytes_per_token`` as ``(p, q)`` integers, exactly the ratio of
    the two floats (``Fraction`` of a float is exact); ``(0, 1)`` where the profile does not give both."""
    if not profile.kv_bytes_per_token or not profile.activation_bytes_per_token:
        return 0, 1
    ratio = Fraction(profile.kv_bytes_per_token) / Fraction(profile.activation_bytes_per_token)
    return ratio.numerator, ratio.denominator


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
        "_attention_forward_share",
        "_attention_heads",
        "_bound_a2a",
        "_choose_from",
        "_coef",
        "_comm_fixed_ms",
        "_comm_ms_per_token",
        "_comp_fixed_ms",
        "_fpt",
        "_fpt_sq",
        "_kv_den",
        "_kv_heads",
        "_kv_num",
        "_linear_forward_share",
        "_mb_ms",
        "_ms_per_flop",
        "_overlap_scope",
        "_ulysses_exposed",
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
        overlap = profile.overlap
        self._overlap_scope: str | None = None if overlap is None else overlap.scope
        self._ulysses_exposed = 0.0 if overlap is None else overlap.ulysses_exposed
        self._attention_forward_share = 1.0 / (1.0 + ATTENTION_BACKWARD_PER_FORWARD)
        self._linear_forward_share = 1.0 / (1.0 + LINEAR_BACKWARD_PER_FORWARD)
        self._kv_num, self._kv_den = gathered_kv_fraction(profile)
        self._coef = self._make_coefficients()

    @property
    def coefficients(self) -> CostCoefficients:
        """The model's coefficients (see ``CostCoefficients``)."""
        return self._coef

    @property
    def topology(self) -> Topology | None:
        """The profile's cluster topology (None: one bandwidth prices every group)."""
        return self.profile.topology

    def link_of(self, ranks: Sequence[int]) -> str | None:
        """The link a group with these GPU ranks uses (``Topology.link_name``); None without topology."""
        topo = self.profile.topology
        return None if topo is None else topo.link_name(ranks)

    def _make_coefficients(self) -> CostCoefficients:
        a2a = self.profile.comm_a2a
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
            topology=self.profile.topology,
            comm_bytes_per_token=self.profile.comm.bytes_per_token,
            a2a_bytes_per_token=0.0 if a2a is None else a2a.bytes_per_token,
            a2a_kv_bytes_per_token=0.0 if a2a is None else a2a.kv_bytes_per_token,
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

    def t_comm_ms(self, sharded_tokens: int, group_size: int | None = None, *, link: str | None = None) -> float:
        """All-gather time for the K/V of ``sharded_tokens`` sharded tokens in one microbatch. With topology
        it depends on the group: ``L.allgather_ms_per_mib * (N-1)/N * T * bytes_per_token / 2^20 + fixed``
        on ``link`` (``CostCoefficients.group_link``), so ``group_size`` is then required."""
        if sharded_tokens <= 0:
            return 0.0
        if self.profile.topology is None:
            return self._comm_ms_per_token * sharded_tokens + self._comm_fixed_ms
        assert group_size is not None and group_size > 1, "with topology, all-gather is priced per group"
        return self._coef.allgather_per_token_ms(group_size, link) * sharded_tokens + self._comm_fixed_ms

    def t_a2a_ms(self, sharded_tokens: int, group_size: int, *, link: str | None = None) -> float:
        """Ulysses all-to-all time of ``sharded_tokens`` sharded tokens over ``group_size`` GPUs: each GPU
        sends and receives about ``T / N`` tokens' activations (module doc), on ``link`` with topology
        (``(N-1)/N`` of it leaves the GPU); 0 when nothing is sharded."""
        if sharded_tokens <= 0:
            return 0.0
        self.check_mode(group_size, ULYSSES)
        per_token = self._coef.a2a_per_token_ms(group_size, link)
        return per_token * sharded_tokens / group_size + self._a2a_fixed_ms

    def _modes_for(self, sharded_tokens: int, group_size: int, mode: str) -> tuple[str, ...]:
        """The modes a microbatch is priced in: its own (the reference), or in a planner's view
        (``choose_modes``) those of the view its group runs (all-gather where none does: such a group is
        kept from sharding, ``shards_on``); the view takes the cheapest."""
        if self._choose_from is not None and sharded_tokens > 0 and group_size > 1:
            options = tuple(m for m in self._choose_from if m == ALLGATHER or self.mode_fits(group_size, m))
            return options or (ALLGATHER,)
        return (mode,)

    def _mode_comm_ms(self, sharded_tokens: int, group_size: int, mode: str, link: str | None) -> float:
        if mode == ULYSSES:
            return self.t_a2a_ms(sharded_tokens, group_size, link=link)
        return self.t_comm_ms(sharded_tokens, group_size, link=link)

    def comm_ms(
        self, sharded_tokens: int, group_size: int, mode: str = DEFAULT_CP_MODE, *, link: str | None = None
    ) -> float:
        """The communication term of a microbatch sharding ``sharded_tokens`` over ``group_size`` GPUs (on
        ``link`` with topology): in ``mode`` (the reference), or in a planner's view (``choose_modes``) the
        cheapest of its modes the group runs (``_modes_for``)."""
        modes = self._modes_for(sharded_tokens, group_size, mode)
        return min(self._mode_comm_ms(sharded_tokens, group_size, m, link) for m in modes)

    def cheapest_comm_ms(self, sharded_tokens: int, max_group_size: int) -> float:
        """A floor on the communication of ``sharded_tokens`` sharded over any group of 2..``max_group_size``
        GPUs (any ranks, so with topology the cheapest link such a group may use) in any mode the request
        allows: ``T_comm(T)``, or with ``ulysses`` allowed also ``T_a2a`` at the widest group (``T/N`` falls
        with N; whether N divides the heads, and the K/V copies, are ignored, which only lowers the floor).
        With topology ``T_comm``'s ``(N-1)/N`` is least at N = 2 and ``T_a2a``'s ``(N-1)/N^2`` at the widest."""
        if sharded_tokens <= 0:
            return 0.0
        if self.profile.topology is None:
            comm = self.t_comm_ms(sharded_tokens)
            if self._bound_a2a and max_group_size > 1:
                comm = min(comm, self._a2a_ms_per_token * sharded_tokens / max_group_size + self._a2a_fixed_ms)
            return comm
        if max_group_size < 2:
            return self._comm_fixed_ms
        comm = self._coef.floor_allgather_per_token_ms(2) * sharded_tokens + self._comm_fixed_ms
        if self._bound_a2a:
            comm = min(comm, self._a2a_floor_ms(sharded_tokens, max_group_size))
        return comm

    def _a2a_floor_ms(self, sharded_tokens: int, group_size: int) -> float:
        """``T_a2a`` without the K/V copies on the cheapest link a group of ``group_size`` may use."""
        topo = self.profile.topology
        assert topo is not None
        links = [topo.inter_node] + ([topo.intra_node] if group_size <= topo.gpus_per_node else [])
        ms_per_mib = min(lk.alltoall_ms_per_mib for lk in links)
        frac = (group_size - 1) / group_size
        a2a_bytes = self.profile.comm_a2a.bytes_per_token if self.profile.comm_a2a is not None else 0.0
        return ms_per_mib * frac * a2a_bytes / MIB * sharded_tokens / group_size + self._a2a_fixed_ms

    def _cheapest_sharded_ms(self, num_tokens: int, flops_ms: float, max_group_size: int) -> float:
        """A floor on ``comm + flops_ms / N`` of one sequence sharded over any group of 2..``max_group_size``
        GPUs, with topology (lower_bound_ms). All-gather: ``k_L (N-1)/N T + F/N = k_L T + (F - k_L T)/N`` is
        monotone in N for a fixed link, so its least is at an end of each range of N with one set of
        possible links (2..gpus_per_node: the cheaper link; wider: inter_node). Ulysses (allowed): both
        terms fall with N in each range, so the widest of each range."""
        topo = self.profile.topology
        assert topo is not None
        ends = {2, max_group_size, min(max_group_size, max(2, topo.gpus_per_node))}
        if topo.gpus_per_node + 1 <= max_group_size:
            ends.add(max(2, topo.gpus_per_node + 1))
        best = math.inf
        for n in ends:
            per_token = self._coef.floor_allgather_per_token_ms(n)
            best = min(best, per_token * num_tokens + self._comm_fixed_ms + flops_ms / n)
            if self._bound_a2a:
                best = min(best, self._a2a_floor_ms(num_tokens, n) + flops_ms / n)
        return best

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
        self,
        local_lengths: Sequence[Sequence[int]],
        sharded_lengths: Sequence[int],
        mode: str = DEFAULT_CP_MODE,
        *,
        link: str | None = None,
    ) -> float:
        """DACP time of one microbatch (eqs. 1-5) plus the per-microbatch overhead; in ``ulysses`` mode the
        communication is ``T_a2a`` instead of ``T_comm`` (module doc). With topology the communication is
        priced on ``link`` (``link_of(ranks)``; None: the link of an aligned group of that size).

        ``local_lengths[j]`` are the lengths kept whole on the group's j-th GPU; the group size N is
        ``len(local_lengths)``. With the profile's ``overlap`` section, each GPU hides only the hidden part
        of the communication behind ``A_j`` (module doc, "Overlap").
        """
        group_size = len(local_lengths)
        assert group_size >= 1, "a microbatch needs at least one GPU"
        sharded_tokens = 0
        sharded_flops = 0.0
        for s in sharded_lengths:
            sharded_tokens += s
            sharded_flops += self._fpt * s + self._fpt_sq * s * s
        dist = self.t_comp_ms(sharded_flops / group_size)
        modes = self._modes_for(sharded_tokens, group_size, mode)
        if self._overlap_scope is None:
            comm = min(self._mode_comm_ms(sharded_tokens, group_size, m, link) for m in modes)
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
        return self._mb_ms + min(self._overlapped_ms(local_lengths, sharded_tokens, m, link) for m in modes) + dist

    def _overlapped_ms(
        self, local_lengths: Sequence[Sequence[int]], sharded_tokens: int, mode: str, link: str | None
    ) -> float:
        """``max_j [max(H_f, A_f) + max(H_b, A_b) + X + (T_comp(local_j) - A_j)]`` (module doc, "Overlap"): H the
        hidden part of the communication, X the exposed part (``ulysses_exposed`` of a Ulysses all-to-all),
        A_j what hides it on GPU j (its local attention, or its whole local compute), each of H and A_j split
        into what forward and backward run (``hidden_forward_share``, ``hiding_split_ms``)."""
        group_size = len(local_lengths)
        comm = self._mode_comm_ms(sharded_tokens, group_size, mode, link)
        exposed = self._ulysses_exposed * comm if mode == ULYSSES else 0.0
        hidden = comm - exposed
        hidden_fwd = self.hidden_forward_share(group_size, mode) * hidden
        hidden_bwd = hidden - hidden_fwd
        whole_compute = self._overlap_scope == OVERLAP_LOCAL_COMPUTE
        worst = 0.0
        for lens in local_lengths:
            if not lens:
                worst = max(worst, comm)
                continue
            tokens = 0
            square = 0
            for s in lens:
                tokens += s
                square += s * s
            local = self.t_comp_ms(self._fpt * tokens + self._fpt_sq * square)
            # the sums of hiding_split_ms over the sequences (and hiding_fixed_split_ms), in one step
            attention = self._ms_per_flop * self._fpt_sq * square
            hides_fwd = self._attention_forward_share * attention
            hides_bwd = attention - hides_fwd
            if whole_compute:
                linear = self._ms_per_flop * self._fpt * tokens + self._comp_fixed_ms
                linear_fwd = self._linear_forward_share * linear
                hides_fwd += linear_fwd
                hides_bwd += linear - linear_fwd
            rest = local - hides_fwd - hides_bwd
            worst = max(worst, max(hidden_fwd, hides_fwd) + max(hidden_bwd, hides_bwd) + exposed + rest)
        return worst

    def hidden_forward_share(self, group_size: int, mode: str) -> float:
        """Forward's share ``h`` of a microbatch's hidden communication (module doc, "Overlap"): 1/2 for
        all-gather (the forward K/V all-gather and the backward dK/dV reduce-scatter move the same bytes);
        for Ulysses the forward Q/K/V exchange against the backward grad-output exchange, in heads:
        ``(H_q + 2 H_kv c) / (2 H_q + 2 H_kv c)``, ``c = lcm(H_kv, N) / H_kv`` the K/V copies
        (worker/dacp.py ``ulysses_kv_copies``)."""
        heads = self.profile.heads
        if mode != ULYSSES or heads is None:
            return 0.5
        forward = heads.attention + 2 * heads.kv * (math.lcm(heads.kv, group_size) // heads.kv)
        return forward / (forward + heads.attention)

    def hiding_split_ms(self, num_tokens: int) -> tuple[float, float]:
        """``(forward, backward)`` of what a local sequence of ``num_tokens`` hides communication behind
        (module doc, "Overlap"): its attention ``a * flops_per_token_sq * S^2`` split 2/7 : 5/7
        (``ATTENTION_BACKWARD_PER_FORWARD``), and with ``with: local_compute`` also its linear compute
        ``a * flops_per_token * S`` split 1/3 : 2/3 (``LINEAR_BACKWARD_PER_FORWARD``)."""
        attention = self._ms_per_flop * self._fpt_sq * num_tokens * num_tokens
        fwd = self._attention_forward_share * attention
        bwd = attention - fwd
        if self._overlap_scope == OVERLAP_LOCAL_COMPUTE:
            linear = self._ms_per_flop * self._fpt * num_tokens
            linear_fwd = self._linear_forward_share * linear
            fwd += linear_fwd
            bwd += linear - linear_fwd
        return fwd, bwd

    def hiding_fixed_split_ms(self) -> tuple[float, float]:
        """``(forward, backward)`` of the fixed compute cost a GPU with local sequences hides communication
        behind: with ``with: local_compute``, ``compute.fixed_ms`` split as the linear compute (1/3 : 2/3);
        none with ``local_attention`` (the attention call's share of launches is in the rest)."""
        if self._overlap_scope != OVERLAP_LOCAL_COMPUTE:
            return 0.0, 0.0
        fwd = self._linear_forward_share * self._comp_fixed_ms
        return fwd, self._comp_fixed_ms - fwd

    @property
    def gathered_kv_ratio(self) -> Fraction:
        """``r = kv_bytes_per_token / activation_bytes_per_token`` as an exact fraction (0 without both)."""
        return Fraction(self._kv_num, self._kv_den)

    def gathered_kv_tokens(self, sharded_tokens: int, group_size: int, mode: str = DEFAULT_CP_MODE) -> int:
        """Bucket tokens each GPU of an all-gather group spends on the gathered K/V of the sharded
        sequences: ``ceil(r * num * T / den)`` with ``num/den = gathered_kv_factor(N)``, ``(N-1)/N`` by
        the contract (module doc), in integers; 0 in Ulysses mode, on one GPU,
        with nothing sharded, or where the profile gives no K/V bytes (then every rule is eq. 7's)."""
        if not self._kv_num or mode == ULYSSES or group_size <= 1 or sharded_tokens <= 0:
            return 0
        num, den = self.gathered_kv_factor(group_size)
        return -(-(self._kv_num * num * sharded_tokens) // (self._kv_den * den))

    def gathered_kv_factor(self, group_size: int) -> tuple[int, int]:
        """The gathered K/V tokens an all-gather GPU of a group of N keeps per sharded token, as ``(num,
        den)``: ``(N-1, N)`` (CONTRACT.md: the other GPUs' shares; ``memory.gathered_kv`` absent or
        ``others``) or ``(2N+1, 2N)`` (``key_prefixes``: each own piece's key prefix, module doc). The one
        factor every memory rule reads (``gathered_kv_tokens``, the ILP's rows)."""
        if self.profile.gathered_kv == GATHERED_KV_KEY_PREFIXES:
            return 2 * group_size + 1, 2 * group_size
        return group_size - 1, group_size

    def bucket_use_tokens(
        self,
        local_lengths: Sequence[Sequence[int]],
        sharded_lengths: Sequence[int],
        *,
        sharding: str = DEFAULT_SHARDING,
        mode: str = DEFAULT_CP_MODE,
    ) -> list[int]:
        """Tokens each GPU of the group really holds: its local sequences plus the pieces that
        ``sharding`` cuts for it (``solver.sharding.position_token_counts``), plus, in all-gather mode, the
        gathered K/V of the sharded sequences in bucket tokens (``gathered_kv_tokens``)."""
        group_size = len(local_lengths)
        pieces = position_token_counts(sharding, sharded_lengths, group_size)
        gathered = self.gathered_kv_tokens(sum(sharded_lengths), group_size, mode)
        return [sum(lens) + piece + gathered for lens, piece in zip(local_lengths, pieces, strict=True)]

    def max_sequence_tokens(self, group_size: int, mode: str = DEFAULT_CP_MODE) -> int:
        """The longest sequence a group of ``group_size`` GPUs holds alone in ``mode``: the largest S with
        ``ceil(S/N) + gathered_kv_tokens(S, N, mode) <= bucket_tokens`` (``N * bucket_tokens`` without the
        gathered K/V: eq. 7). Both terms grow with S, so a bisection finds it."""
        most = group_size * self.bucket_tokens
        if not self.gathered_kv_tokens(most, group_size, mode):
            return most
        low, high = 0, most
        while low < high:
            mid = (low + high + 1) // 2
            if (
                max_position_tokens(mid, group_size) + self.gathered_kv_tokens(mid, group_size, mode)
                <= self.bucket_tokens
            ):
                low = mid
            else:
                high = mid - 1
        return low

    def max_sequence_tokens_in(self, group_size: int, modes: Sequence[str]) -> int:
        """The longest sequence a group of ``group_size`` holds alone in the one of ``modes`` it runs that
        holds most (Ulysses keeps no gathered K/V); all-gather's where none of them runs on the group."""
        runnable = [m for m in modes if self.mode_fits(group_size, m)] or [DEFAULT_CP_MODE]
        return max(self.max_sequence_tokens(group_size, m) for m in runnable)

    def view_gathered_kv_tokens(self, sharded_tokens: int, group_size: int) -> int:
        """The least gathered K/V any mode of this view keeps (``memory_modes``): what a planner placing
        sequences reserves on every GPU of the group (0 where Ulysses may run the microbatch)."""
        if not self._kv_num:
            return 0
        return min(self.gathered_kv_tokens(sharded_tokens, group_size, m) for m in self.memory_modes(group_size))

    def memory_modes(self, group_size: int) -> tuple[str, ...]:
        """The modes ``fits`` may keep a microbatch on ``group_size`` GPUs in when it is not told one: the
        modes this view may choose on the group (``view_modes``), all-gather in the reference view."""
        return self.view_modes(group_size) or (ALLGATHER,)

    def fits(
        self, local_lengths: Sequence[Sequence[int]], sharded_lengths: Sequence[int], mode: str | None = None
    ) -> bool:
        """Whether every GPU of the group stays within ``bucket_tokens`` in real tokens, in every sharding
        mode: ``sum local[j] + ceil(T/N) + gathered_kv_tokens(T, N, mode) <= bucket`` for every j (eq. 7
        and the gathered K/V; module doc). ``mode`` None: in some mode this view may choose
        (``memory_modes``; ``cheapest_mode`` then keeps to the modes that fit)."""
        group_size = len(local_lengths)
        sharded_tokens = sum(sharded_lengths)
        share = max_position_tokens(sharded_tokens, group_size)
        most_local = max((sum(lens) for lens in local_lengths), default=0)
        if not self._kv_num or not sharded_tokens or group_size <= 1:
            return most_local <= self.bucket_tokens - share
        modes = (mode,) if mode is not None else self.memory_modes(group_size)
        return any(
            most_local <= self.bucket_tokens - share - self.gathered_kv_tokens(sharded_tokens, group_size, m)
            for m in modes
        )

    def spec_time_ms(self, spec: MicrobatchSpec | Placement, lengths: Sequence[int]) -> float:
        """Time of a planner's microbatch, looking lengths up by global sequence id, on its ranks' link."""
        return self.microbatch_time_ms(
            [[lengths[i] for i in ids] for ids in spec.local],
            [lengths[i] for i in spec.sharded],
            spec.mode,
            link=self.link_of(spec.ranks),
        )

    def cheapest_mode(self, spec: MicrobatchSpec | Placement, lengths: Sequence[int], modes: Sequence[str]) -> str:
        """Of ``modes`` that the group can run (``mode_fits``) and whose memory holds ``spec`` (``fits``;
        all of them where none does, for the validator to name), the one pricing ``spec`` lowest; ties go to
        the first in ``CP_MODES`` order. A microbatch with nothing sharded has no communication: it keeps
        the default, as it does when no mode fits (the validator then names the microbatch)."""
        n = len(spec.ranks)
        if not spec.sharded or n == 1:
            return DEFAULT_CP_MODE
        fitting = [m for m in CP_MODES if m in modes and self.mode_fits(n, m)]
        if not fitting:
            return DEFAULT_CP_MODE
        local = [[lengths[i] for i in ids] for ids in spec.local]
        sharded = [lengths[i] for i in spec.sharded]
        # of those, the ones whose memory holds the microbatch (the gathered K/V differs by mode: ``fits``)
        fitting = [m for m in fitting if self.fits(local, sharded, m)] or fitting
        link = self.link_of(spec.ranks)
        times = [self.microbatch_time_ms(local, sharded, m, link=link) for m in fitting]
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
                link=self.link_of(s.ranks),
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

        With topology, ``T_comm`` depends on the group: the sharded option is the least over every group
        size N in 2..G of ``T_comm`` on the cheapest link a group of N may use (whatever its ranks: a group
        wider than a node is ``inter_node``, a narrower one may be either) plus ``a*FLOPs(S_max) / N``
        (``_cheapest_sharded_ms``), so the bound holds for any ranks. The profile's ``overlap`` never
        prices a microbatch below the plain form (module doc), so the bound holds under it too.
        """
        if not lengths:
            return 0.0
        gpus = parallel.num_gpus
        total_flops = sum(self.flops(s) for s in lengths)
        average = self._ms_per_flop * total_flops / gpus + self._mb_ms * sum(lengths) / (self.bucket_tokens * gpus)
        longest = max(lengths)
        flops_ms = self._ms_per_flop * self.flops(longest)
        if gpus <= 1:
            options = []
        elif self.profile.topology is None:
            options = [self.cheapest_comm_ms(longest, gpus) + flops_ms / gpus]
        else:
            options = [self._cheapest_sharded_ms(longest, flops_ms, gpus)]
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

"""The reference cost model (docs/formats.md; Skrull section 4.1 eqs. 1-7, eq. 8, appendix C).

For a sequence of S tokens (Skrull eq. 13 summed over layers, x3 for forward + backward):

    FLOPs(S)   = flops_per_token * S + flops_per_token_sq * S^2
    T_comp(F)  = ms_per_tflop * F / 1e12 + compute.fixed_ms          (F > 0; 0 for F = 0)   [eq. 14]
    T_comm(T)  = ms_per_mib * T * bytes_per_token / 2^20 + comm.fixed_ms   (T > 0; 0 for T = 0) [eq. 16]

A microbatch on a group of N GPUs, local sequences ``local[j]`` whole on GPU j, ``sharded`` split over
all N (DACP, eqs. 1-5):

    Time = microbatch_ms + max_j [ max(T_comm(sum sharded S), T_comp(sum_{local[j]} FLOPs(S)))
                                   + T_comp(sum_{sharded} FLOPs(S) / N) ]

Memory (eq. 7): ``sum_{local[j]} S + sum_{sharded} S / N <= bucket_tokens`` for every j. It is checked
in integers as ``N * sum_{local[j]} S + sum_{sharded} S <= N * bucket_tokens`` so that planners and the
validator never disagree through rounding.

Iteration time (eq. 8): the max over GPUs of the summed Time of the microbatches each GPU takes part in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from skrull.solver.profile import Profile
from skrull.solver.types import MicrobatchSpec, Parallel

MIB = float(2**20)


class CostModel:
    """The contract's reference model for one profile and bucket size. Immutable after construction."""

    __slots__ = (
        "_comm_fixed_ms",
        "_comm_ms_per_token",
        "_comp_fixed_ms",
        "_fpt",
        "_fpt_sq",
        "_mb_ms",
        "_ms_per_flop",
        "bucket_tokens",
        "profile",
    )

    def __init__(self, profile: Profile, *, bucket_tokens: int | None = None) -> None:
        self.profile = profile
        self.bucket_tokens = profile.bucket_tokens if bucket_tokens is None else bucket_tokens
        self._fpt = profile.compute.flops_per_token
        self._fpt_sq = profile.compute.flops_per_token_sq
        self._ms_per_flop = profile.compute.ms_per_tflop / 1e12
        self._comp_fixed_ms = profile.compute.fixed_ms
        self._comm_ms_per_token = profile.comm.ms_per_mib * profile.comm.bytes_per_token / MIB
        self._comm_fixed_ms = profile.comm.fixed_ms
        self._mb_ms = profile.microbatch_ms

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

    @property
    def microbatch_overhead_ms(self) -> float:
        return self._mb_ms

    # --- microbatches ----------------------------------------------------------------------------
    def microbatch_time_ms(self, local_lengths: Sequence[Sequence[int]], sharded_lengths: Sequence[int]) -> float:
        """DACP time of one microbatch (eqs. 1-5) plus the per-microbatch overhead.

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
        comm = self.t_comm_ms(sharded_tokens)
        dist = self.t_comp_ms(sharded_flops / group_size)
        worst = 0.0
        for lens in local_lengths:
            local_flops = 0.0
            for s in lens:
                local_flops += self._fpt * s + self._fpt_sq * s * s
            local = self.t_comp_ms(local_flops)
            worst = max(worst, max(comm, local) + dist)
        return self._mb_ms + worst

    def bucket_use_tokens(self, local_lengths: Sequence[Sequence[int]], sharded_lengths: Sequence[int]) -> list[float]:
        """Tokens held by each GPU of the group: ``sum local[j] + sum sharded / N`` (eq. 7)."""
        share = sum(sharded_lengths) / len(local_lengths)
        return [sum(lens) + share for lens in local_lengths]

    def fits(self, local_lengths: Sequence[Sequence[int]], sharded_lengths: Sequence[int]) -> bool:
        """Whether every GPU of the group stays within ``bucket_tokens`` (eq. 7, exact in integers)."""
        group_size = len(local_lengths)
        sharded = sum(sharded_lengths)
        limit = group_size * self.bucket_tokens
        return all(group_size * sum(lens) + sharded <= limit for lens in local_lengths)

    def spec_time_ms(self, spec: MicrobatchSpec, lengths: Sequence[int]) -> float:
        """Time of a planner's microbatch, looking lengths up by global sequence id."""
        return self.microbatch_time_ms(
            [[lengths[i] for i in ids] for ids in spec.local], [lengths[i] for i in spec.sharded]
        )

    # --- iterations ------------------------------------------------------------------------------
    @staticmethod
    def iteration_time_ms(microbatches: Iterable[tuple[Sequence[int], float]], num_gpus: int) -> float:
        """Max over GPUs of the summed time of the microbatches each takes part in (eq. 8).

        ``microbatches`` yields ``(ranks, time_ms)`` pairs.
        """
        per_gpu = [0.0] * num_gpus
        for ranks, time_ms in microbatches:
            for g in ranks:
                per_gpu[g] += time_ms
        return max(per_gpu, default=0.0)

    def lower_bound_ms(self, lengths: Sequence[int], parallel: Parallel) -> float:
        """No plan under this model beats this (docs/formats.md "Cost model": the lower bound).

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

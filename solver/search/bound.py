"""The specification's layout-free lower bound of an iteration (docs/formats.md, "Lower bound of an iteration").

With ``a = ms_per_tflop / 1e12``, G = dp*cp GPUs and S_max the longest sequence::

    max( sum_S a*FLOPs(S) / G + microbatch_ms * sum(S) / (bucket_tokens * G),
         microbatch_ms + compute.fixed_ms + min( a*FLOPs(S_max)            if S_max <= bucket_tokens,
                                                 T_comm(S_max) + a*FLOPs(S_max) / G ) )

The first term: the average GPU computes its share of all FLOPs and runs its share of microbatches (each
holds at most ``bucket_tokens`` per GPU). The second: the longest sequence runs somewhere, either whole
on one GPU or sharded over at most G GPUs. It holds for every group shape, so it is the yardstick of
``auto``, whose plans may use groups wider than CP; it is ``CostModel.lower_bound_ms``, every plan's
``lower_bound_ms`` (``CostModel.static_bound_ms`` is the static-layout bound, a plan's ``static_bound_ms``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from skrull.solver.cost import CostModel
from skrull.solver.plan import Parallel


def layout_free_bound_ms(lengths: Sequence[int], cost: CostModel, parallel: Parallel) -> float:
    """No plan under the reference model, with any groups, beats this; 0 for an empty batch
    (``CostModel.lower_bound_ms``, the figure a plan reports as ``lower_bound_ms``)."""
    return cost.lower_bound_ms(lengths, parallel)


def tight_bound_ms(lengths: Sequence[int], cost: CostModel, parallel: Parallel) -> float:
    """The layout-free bound, tightened by whole microbatches: also valid for every layout.

    Every GPU that computes runs at least one microbatch that costs ``microbatch_ms`` plus one
    ``compute.fixed_ms`` (eqs. 1-4), and the k GPUs that compute share all FLOPs and all tokens (at most
    ``bucket_tokens`` per GPU per microbatch), so the slowest of them needs at least
    ``a*sum FLOPs / k + microbatch_ms * max(1, sum(S) / (bucket_tokens * k)) + compute.fixed_ms``, which
    falls with k; k = dp*cp gives the bound. It exceeds the reference lower bound when a batch fills less
    than one microbatch per GPU (light batches, where the specification's average term counts a fraction of
    a microbatch).
    """
    if not lengths:
        return 0.0
    profile = cost.profile
    gpus = parallel.num_gpus
    ms_per_flop = profile.compute.ms_per_tflop / 1e12
    rounds = max(1.0, sum(lengths) / (cost.bucket_tokens * gpus))
    busy = ms_per_flop * sum(cost.flops(s) for s in lengths) / gpus + profile.microbatch_ms * rounds
    return max(layout_free_bound_ms(lengths, cost, parallel), busy + profile.compute.fixed_ms)


def microbatch_floor_ms(lengths: Sequence[int], cost: CostModel, parallel: Parallel) -> float:
    """``tight_bound_ms``, raised by whole microbatches per GPU: also valid for every layout.

    A GPU taking part in m microbatches pays at least ``c = microbatch_ms + compute.fixed_ms`` for each
    (eqs. 1-5: the microbatch's time, charged to all its GPUs, includes its own compute and one fixed
    term) plus its own FLOPs, and holds at most ``bucket_tokens`` tokens per microbatch (eq. 7). No
    token carries more FLOPs time than a token of the longest sequence,
    ``d = a*FLOPs(S_max) / S_max`` (``FLOPs(s)/s`` grows with s; a sharded sequence puts ``s/n`` tokens
    and ``FLOPs/n`` on each GPU), so m microbatches hold at most ``m*bucket_tokens*d`` of FLOPs time and
    some GPU needs ``m >= ceil(a*sum FLOPs / (G*bucket_tokens*d))``, whence
    ``a*sum FLOPs / G + c * max(1, ceil(a*sum FLOPs / (G*bucket_tokens*d)))``. It exceeds the tight bound
    when the average GPU holds a fraction of a microbatch more than a whole number (two microbatches
    per GPU where the token average counts 1.5).
    """
    tight = tight_bound_ms(lengths, cost, parallel)
    if not lengths:
        return tight
    profile = cost.profile
    gpus = parallel.num_gpus
    ms_per_flop = profile.compute.ms_per_tflop / 1e12
    flops_ms = ms_per_flop * sum(cost.flops(s) for s in lengths)
    longest = max(lengths)
    density = ms_per_flop * cost.flops(longest) / longest
    if density <= 0:
        return tight
    rounds = max(1, math.ceil(flops_ms / (gpus * cost.bucket_tokens * density) - 1e-9))
    per_microbatch = profile.microbatch_ms + profile.compute.fixed_ms
    return max(tight, flops_ms / gpus + rounds * per_microbatch)


def sharding_floor_ms(lengths: Sequence[int], cost: CostModel, parallel: Parallel) -> float:
    """``microbatch_floor_ms``, raised by what sharding the long sequences costs: valid for every layout.

    With ``a = ms_per_tflop / 1e12``, ``f_k = a*FLOPs(S_k)``, ``A = sum_k f_k``, G GPUs,
    ``c = microbatch_ms + compute.fixed_ms`` and ``e = min(compute.fixed_ms, comm.fixed_ms)``
    (``comm_a2a.fixed_ms`` too where ``ulysses`` is allowed), take any set F of sequences and any plan
    (any groups) with iteration time Z. Either

    * some k in F runs whole on one GPU (in ``local``, or alone on a group of one): that GPU's
      microbatch costs at least ``microbatch_ms + T_comp(FLOPs(S_k)) >= c + f_k``, so
      ``Z >= W_F = min_{k in F, S_k <= bucket} (c + f_k)`` (no k fits whole: W_F is infinite); or
    * every k in F is sharded over a group of two GPUs or more. Let P be the p >= 2 GPUs that take part
      in a microbatch with sharded work. Such a GPU pays, for that microbatch, ``microbatch_ms +
      max(T_comm, T_comp(local_j)) + T_comp(sharded FLOPs / N)`` (eqs. 1-5; a microbatch charges its
      slowest GPU's time to each of its GPUs, at least the GPU's own), and ``max(T_comm, T_comp(local_j))``
      is at least its local FLOPs time plus ``compute.fixed_ms`` (local work) or ``T_comm >=
      comm.fixed_ms`` (none), so the GPU's load is at least its own FLOPs time plus ``c + e``. Every
      other GPU that computes pays at least its own FLOPs time plus ``c``. Summing over the k GPUs that
      compute (k <= G): ``Z >= c + (A + p*e) / k >= c + (A + p*e) / G``. The GPUs of P also hold all of
      F's FLOPs, so ``Z >= c + e + A_F / p`` with ``A_F = sum_{k in F} f_k``; and p is at least
      ``ceil(S_max(F) / bucket_tokens)`` (every GPU holds at most a bucket of the longest's pieces).
      Hence ``Z >= B_F = min_{p_min <= p <= G} max(c + (A + p*e) / G, c + e + A_F / p)``.

    So ``Z >= min(W_F, B_F)`` for every F; this takes the best over F = the t sequences of most FLOPs
    (t = 1..K), and the floor. It exceeds the floor when sequences too long to run whole within the
    floor must be sharded: each GPU they touch pays a second fixed cost (``e``), which the floor, counting
    one ``compute.fixed_ms`` per GPU, leaves out; e.g. 24 sharegpt-shaped sequences on DP2 x CP4 with
    Qwen2.5-0.5B, whose three longest each take more FLOPs time than the average GPU.

    Neither the profile's ``topology`` nor its ``overlap`` changes this: the floor counts no communication
    beyond its fixed cost ``e``, which no link changes, and the overlap form never prices a microbatch below
    the plain one (solver/cost.py), so every step above holds under both.
    """
    floor = microbatch_floor_ms(lengths, cost, parallel)
    gpus = parallel.num_gpus
    if not lengths or gpus < 2:
        return floor
    profile = cost.profile
    ms_per_flop = profile.compute.ms_per_tflop / 1e12
    per_microbatch_ms = profile.microbatch_ms + profile.compute.fixed_ms
    second_fixed_ms = min(profile.compute.fixed_ms, cost.cheapest_comm_fixed_ms)
    flops_ms = sorted(((ms_per_flop * cost.flops(s), s) for s in lengths), reverse=True)
    total_ms = sum(f for f, _ in flops_ms)
    best = floor
    forced_ms = 0.0
    whole_ms = math.inf  # W_F
    longest = 0
    for f, s in flops_ms:
        forced_ms += f
        longest = max(longest, s)
        if s <= cost.bucket_tokens:
            whole_ms = min(whole_ms, per_microbatch_ms + f)
        if whole_ms <= best:
            break  # W_F only falls as F grows: no larger F can raise the bound
        fewest = max(2, math.ceil(longest / cost.bucket_tokens))
        sharded_ms = _min_over_group_sizes(
            fewest, gpus, a=per_microbatch_ms, total_ms=total_ms, e=second_fixed_ms, forced_ms=forced_ms
        )
        best = max(best, min(whole_ms, sharded_ms))
    return best


def _min_over_group_sizes(fewest: int, gpus: int, *, a: float, total_ms: float, e: float, forced_ms: float) -> float:
    """``min_{fewest <= p <= gpus} max(u(p), v(p))`` with ``u(p) = a + (total_ms + p*e) / gpus`` (rising in p)
    and ``v(p) = a + e + forced_ms / p`` (falling): the minimum of the larger of a rising and a falling
    function is at an integer next to where they cross, ``(e/G) p^2 + (A/G - e) p - A_F = 0``, or at an
    end of the range; so four evaluations instead of one per group size (65,536 sequences on 16,384 GPUs
    took 86 s as a scan)."""
    if fewest > gpus:
        return math.inf

    def value(p: int) -> float:
        return max(a + (total_ms + p * e) / gpus, a + e + forced_ms / p)

    qa, qb, qc = e / gpus, total_ms / gpus - e, -forced_ms
    if qa > 0:  # the positive root (qc <= 0)
        cross = (-qb + math.sqrt(qb * qb - 4 * qa * qc)) / (2 * qa)
    elif qb > 0:  # no second fixed cost: linear
        cross = -qc / qb
    else:  # nothing to share: every p gives the same
        cross = float(gpus)
    candidates = {fewest, gpus}
    for p in (math.floor(cross) - 1, math.floor(cross), math.ceil(cross), math.ceil(cross) + 1):
        candidates.add(min(gpus, max(fewest, p)))
    return min(value(p) for p in candidates)

"""Calibration from the run: the cost model refitted on the microbatches training really ran.

A profile is fitted once, offline, on one decoder layer (``skrull profile``), or derived from datasheets;
a planner optimises the model it is given, so a wrong model makes it trade the wrong things (on one H100,
whole planned steps took 11-15% longer than estimated). Here every rank times each of its microbatches
(CUDA events on a GPU, ``perf_counter`` after a device synchronisation on a CPU; ``MicrobatchTimer``)
and reports, with each time, what the reference cost model prices (docs/formats.md): the group of the
microbatch, the lengths kept whole on each of its GPUs and the lengths sharded over it. Gathered over
the job, the ranks' parts of one microbatch make one measurement: from when its last member starts it to
when its last member ends it (``measured_microbatches``). Not the slowest member's own time: a member that
arrives early, e.g. GPU 1 after its empty parts of GPU 0's local-only microbatches, waits inside the first
collective for the others, and its timer counts that wait, which is the others' earlier microbatches, not
this one. Taken as the slowest member's time, in a DP1 x CP2 run on 2 CPU cores (bench/calibration_comm.py)
the first sharded microbatch after four local ones measured 189 ms where the next three took 26-35 ms, and
the fit, trying to explain the waits, missed every microbatch by a median 62%. The model's group starts a
microbatch together (``max_j``), so its time is the group's from the moment it is together.

The fit (``fit_profile``) is ``fit_nonnegative`` of worker/profiling/fit.py, the same relative,
non-negative least squares ``skrull profile`` fits its compute with, over one row per microbatch, with
ONE COEFFICIENT PER TERM::

    ms = a * tokens + b * tokens_sq + c
         + sum over the run's (collective, link) of m[collective, link] * MiB + f[collective] * [it ran]

with ``tokens`` and ``tokens_sq`` the token and squared-token work of the microbatch's critical GPU
(its local sequences whole, plus each sharded sequence's ``S / N`` and ``S^2 / N``: eqs. 3-5), and the
MiB the contract prices the microbatch's collective per (``comm_mib``): all-gather ``T * comm.bytes_per_token``,
all-to-all ``(T/N) * B_a2a(N)``, with ``topology`` times ``(N-1)/N`` (bus traffic) and one ``m`` per link
the run's groups used. The coefficients map onto the profile's: ``ms_per_tflop = a * 1e12 / flops_per_token``
(the FLOP count per token is the starting profile's, so ``ms_per_tflop * FLOPs`` reproduces the fit),
``flops_per_token_sq = b * 1e12 / ms_per_tflop``, ``microbatch_ms = c``, ``compute.fixed_ms = 0`` (the
per-microbatch constant takes it: a microbatch with both local and sharded work would otherwise pay it
twice); ``m`` goes to ``comm.ms_per_mib`` / ``comm_a2a.ms_per_mib``, or with ``topology`` to the link's
``allgather_ms_per_mib`` / ``alltoall_ms_per_mib``; ``f`` to ``comm.fixed_ms`` / ``comm_a2a.fixed_ms``.
Memory, heads and topology are kept. The critical GPU is the one with the most local work under the
previous fit (each reweighting round).

A coefficient the run cannot identify keeps the starting profile's value, as it is, and the log and
``calibrated.kept_starting`` say which and why: a collective (on a link) shown by fewer than
``MIN_COMMUNICATING`` microbatches; a fixed cost whose collective's largest MiB was less than
``MIN_MIB_SPREAD`` times its smallest over the run (the two cannot be told apart: in a DP1 x CP2 run on
the loaded 2-core VM with sharded microbatches of 1.0-1.3 MiB, a free fit put the whole injected delay
in the fixed cost and none per MiB; the per-MiB term is then fitted alone, as the bandwidth a planner
scales by); a mode the run never ran. It is never scaled by another
coefficient's ratio (a slower compute says nothing of a link). Each row follows the overlap the worker
runs (worker/dacp.py): a collective hides behind the local attention of its layer only, forward's
behind forward's attention and backward's behind backward's (two ``max``, as solver/cost.py prices them),
and Ulysses' second exchange in each direction behind nothing (``ULYSSES_EXPOSED``, or the profile's ``overlap``); of
each ``max`` the row keeps the side that dominates at the previous round's coefficients.

Recency: a microbatch measured ``k`` iterations before the latest weighs ``2^(-k / half_life_iterations)``
in the fit (``HALF_LIFE_ITERATIONS``, 8). A machine's speed drifts over a run (other jobs, clocks, caches
warming, a shared host's load: in bench/calibration.py on a shared 2-core VM, like iterations of four
microbatches took 97 ms, then 264 ms four iterations later); a fit weighing its whole history alike
predicts the average machine, while the plan is for the iterations about to run. A short half-life costs
variance instead (noise that is not drift is averaged over fewer microbatches): at 8 a fit rests on about
12 iterations' worth, so a short run's fit is nearly the unweighted one and a long run's distant past
fades. bench/calibration.py replays each run's measurements one iteration ahead at several half-lives; on
the loaded 2-core VM no setting was consistently better (docs/benchmarks.md), so 8 is the cautious one.

Robustness: the first ``warmup_iterations`` iterations are left out (allocator, kernel selection, lazy
initialisation). The fit minimises the absolute relative error rather than its square (iteratively
reweighted: each squared residual weighed by ``1 / max(|r|, 1%)``, ``IRLS_ROUNDS`` rounds), so what it
matches is the typical microbatch (the median error is what it is judged by) and a preempted core,
which only ever adds time, pulls it little; microbatches whose relative residual exceeds ``max(4 x
median, 25%)`` are left out of the next round and counted as ``dropped_outliers``.

The result is an ordinary profile document (``calibrated`` records from what, how many microbatches,
when and where), readable by every planner and by ``skrull profile --check``.
"""

from __future__ import annotations

import datetime
import logging
import math
import platform
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from skrull.solver.cost import ATTENTION_BACKWARD_PER_FORWARD, CostModel
from skrull.solver.cp_modes import ALLGATHER, ULYSSES
from skrull.solver.profile import Profile, load_profile, profile_from_dict
from skrull.worker.profiling.fit import MIB, FitError, fit_nonnegative

#: Iterations left out of every fit: the first run of every kernel and allocation is slower.
WARMUP_ITERATIONS = 1
#: Fewest microbatches a fit is made from.
MIN_MICROBATCHES = 6
#: Fewest communicating microbatches (sharded over a group) the communication terms are fitted from.
MIN_COMMUNICATING = 4
#: The share of Ulysses' all-to-all volume no local work hides (worker/dacp.py: outputs back in forward,
#: dQ/dK/dV back in backward), where the profile has no ``overlap`` section to say it.
ULYSSES_EXPOSED = 0.5
#: Forward's share of a local attention's time (solver/cost.py: backward runs 2.5x forward's FLOPs).
ATTENTION_FWD = 1.0 / (1.0 + ATTENTION_BACKWARD_PER_FORWARD)
#: Largest over smallest MiB of a collective's microbatches from which its fixed cost is fitted too.
MIN_MIB_SPREAD = 2.0
#: Shortest timing a fit takes as a measurement (1 ns): below it, a clock's rounding or a corrupt value (a
#: denormal timing made the least squares fail to converge, which no training run should stop on).
MIN_TIMING_MS = 1e-6
#: Reweighting rounds of the least-absolute-error fit (each picks the critical GPU anew).
IRLS_ROUNDS = 8
#: Iterations over which a microbatch's weight in the fit halves: the fit follows the machine as it is now.
HALF_LIFE_ITERATIONS = 8.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RankTiming:
    """One GPU's part of one microbatch, timed: what the cost model prices, and the milliseconds."""

    iteration: int
    step: int
    ranks: tuple[int, ...]
    position: int
    local_lengths: tuple[int, ...]
    sharded_lengths: tuple[int, ...]
    ms: float
    #: how the sharded part ran (the plan's ``mode``): which communication term the time shows
    mode: str = ALLGATHER

    def to_list(self) -> list[Any]:
        return [self.iteration, self.step, list(self.ranks), self.position, list(self.local_lengths),
                list(self.sharded_lengths), self.ms, self.mode]  # fmt: skip

    @classmethod
    def from_list(cls, row: Sequence[Any]) -> RankTiming:
        it, step, ranks, position, local, sharded, ms, *rest = row
        return cls(
            iteration=int(it), step=int(step), ranks=tuple(int(r) for r in ranks), position=int(position),
            local_lengths=tuple(int(s) for s in local), sharded_lengths=tuple(int(s) for s in sharded), ms=float(ms),
            mode=str(rest[0]) if rest else ALLGATHER,
        )  # fmt: skip


def rank_timings(iteration: int, microbatches: Sequence[Any], ms: Sequence[float]) -> list[RankTiming]:
    """This rank's timings of one iteration from its ``ReadyMicrobatch``es (worker/dataloader.py) or
    ``MicrobatchLayout``s and their milliseconds, in step order."""
    if len(microbatches) != len(ms):
        raise ValueError(f"{len(ms)} timings for {len(microbatches)} microbatches")
    out = []
    for mb, t in zip(microbatches, ms, strict=True):
        layout = getattr(mb, "layout", mb)
        out.append(
            RankTiming(
                iteration=iteration,
                step=layout.step,
                ranks=tuple(layout.ranks),
                position=layout.position,
                local_lengths=tuple(layout.local_lengths),
                sharded_lengths=tuple(s.num_tokens for s in layout.sharded),
                ms=float(t),
                mode=str(getattr(layout, "mode", ALLGATHER)),
            )
        )
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredMicrobatch:
    """One microbatch over its whole group: every member's local lengths, the sharded ones, the slowest time."""

    iteration: int
    step: int
    ranks: tuple[int, ...]
    local: tuple[tuple[int, ...], ...]
    sharded: tuple[int, ...]
    ms: float
    mode: str = ALLGATHER

    @property
    def communicates(self) -> bool:
        return len(self.ranks) > 1 and bool(self.sharded)

    def to_record(self, profile: str) -> dict[str, Any]:
        """One row of ``skrull finetune --calibration-records-out``, with the name of the profile its plan was
        made with (``from_record`` reads it back)."""
        return {
            "iteration": self.iteration, "step": self.step, "ranks": list(self.ranks),
            "local": [list(x) for x in self.local], "sharded": list(self.sharded), "mode": self.mode,
            "ms": self.ms, "profile": profile,
        }  # fmt: skip

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> MeasuredMicrobatch:
        return cls(
            iteration=int(record["iteration"]), step=int(record["step"]),
            ranks=tuple(int(r) for r in record["ranks"]),
            local=tuple(tuple(int(n) for n in x) for x in record["local"]),
            sharded=tuple(int(n) for n in record["sharded"]), ms=float(record["ms"]), mode=str(record["mode"]),
        )  # fmt: skip


def _start_offsets_ms(timings: Sequence[RankTiming]) -> dict[tuple[int, int, tuple[int, ...], int], float]:
    """When each rank started each of its timed microbatches, in ms from the start of its iteration: the sum
    of its earlier microbatches' times in step order. A rank's timed microbatches run back to back, and its
    ranks start an iteration together (``scheduled_step`` starts timing right after the world's all-reduce of
    the target count), so these offsets of different ranks are on one clock, with no clock shared between
    processes or nodes (CUDA events give durations only)."""
    per_rank: dict[tuple[int, int], list[RankTiming]] = {}
    for t in timings:
        per_rank.setdefault((t.iteration, t.ranks[t.position]), []).append(t)
    out = {}
    for (iteration, _), parts in per_rank.items():
        clock = 0.0
        for t in sorted(parts, key=lambda t: t.step):
            out[(iteration, t.step, t.ranks, t.position)] = clock
            clock += t.ms
    return out


def measured_microbatches(timings: Iterable[RankTiming]) -> list[MeasuredMicrobatch]:
    """Group the ranks' parts by microbatch; a microbatch some member did not report is left out.

    A communicating microbatch's time is ``max_j (start_j + ms_j) - max_j start_j`` over its members j,
    ``start_j`` when member j started it (``_start_offsets_ms``): the group's time from the moment its last
    member arrived, since its collectives hold the early ones until then (module doc). One that does not
    communicate holds nobody: its members run their parts independently, and its time is the slowest
    member's own. With every member starting together the two are the same."""
    timings = list(timings)
    starts = _start_offsets_ms(timings)
    groups: dict[tuple[int, int, tuple[int, ...]], dict[int, RankTiming]] = {}
    for t in timings:
        groups.setdefault((t.iteration, t.step, t.ranks), {})[t.position] = t
    out = []
    for (iteration, step, ranks), parts in sorted(groups.items()):
        if len(parts) != len(ranks):
            continue
        first = parts[0]
        begin = {p: starts[(iteration, step, ranks, p)] for p in parts}
        together = max(begin.values()) if len(ranks) > 1 and first.sharded_lengths else None
        out.append(
            MeasuredMicrobatch(
                iteration=iteration, step=step, ranks=ranks,
                local=tuple(parts[p].local_lengths for p in range(len(ranks))), sharded=first.sharded_lengths,
                ms=(
                    max(t.ms for t in parts.values())
                    if together is None
                    else max(begin[p] + t.ms for p, t in parts.items()) - together
                ),
                mode=first.mode,
            )
        )  # fmt: skip
    return out


def estimate_ms(model: CostModel, mb: MeasuredMicrobatch) -> float:
    """The reference model's time of a measured microbatch (exactly what a plan's ``estimated_ms`` says)."""
    return model.microbatch_time_ms(mb.local, mb.sharded, mb.mode)


def iteration_times(mbs: Sequence[MeasuredMicrobatch], model: CostModel) -> dict[int, tuple[float, float]]:
    """Per iteration ``(estimated, measured)`` ms: the slowest GPU's sum over the microbatches it takes part
    in (the contract's iteration time), estimated by ``model`` and measured."""
    per: dict[int, dict[int, list[float]]] = {}
    for mb in mbs:
        est = estimate_ms(model, mb)
        for r in mb.ranks:
            cell = per.setdefault(mb.iteration, {}).setdefault(r, [0.0, 0.0])
            cell[0] += est
            cell[1] += mb.ms
    return {
        it: (max(c[0] for c in ranks.values()), max(c[1] for c in ranks.values())) for it, ranks in sorted(per.items())
    }


def median_error(mbs: Sequence[MeasuredMicrobatch], model: CostModel) -> float:
    """Median of ``|estimated - measured| / measured`` over the microbatches."""
    return float(statistics.median(abs(estimate_ms(model, mb) - mb.ms) / mb.ms for mb in mbs)) if mbs else float("nan")


def iteration_error(mbs: Sequence[MeasuredMicrobatch], model: CostModel) -> float:
    """Median over iterations of ``|estimated - measured| / measured`` iteration time."""
    times = iteration_times(mbs, model)
    return float(statistics.median(abs(e - m) / m for e, m in times.values())) if times else float("nan")


@dataclass(frozen=True, slots=True, kw_only=True)
class _Term:
    """One communication coefficient of the fit: a collective's ms per MiB on one link, or its fixed cost."""

    mode: str  # ALLGATHER or ULYSSES
    link: str | None  # a topology link name, None for the profile's comm / comm_a2a (no topology); fixed: None
    fixed: bool

    @property
    def name(self) -> str:
        what = "fixed_ms" if self.fixed else "ms_per_mib"
        section = "comm" if self.mode == ALLGATHER else "comm_a2a"
        if self.fixed or self.link is None:
            return f"{section}.{what}"
        return f"topology.{self.link}.{'allgather' if self.mode == ALLGATHER else 'alltoall'}_ms_per_mib"


def _link(start: Profile, ranks: Sequence[int]) -> str | None:
    return start.topology.link_name(ranks) if start.topology is not None else None


def comm_mib(start: Profile, mb: MeasuredMicrobatch) -> float:
    """The MiB a microbatch's communication term is priced per (docs/formats.md): all-gather ``T * bytes_per_token``
    of its sharded tokens, all-to-all ``(T/N) * B_a2a(N)``; with ``topology``, times ``(N-1)/N`` (the bus
    traffic a busbw coefficient is per). 0 for a microbatch that does not communicate."""
    if not mb.communicates:
        return 0.0
    n = len(mb.ranks)
    tokens = float(sum(mb.sharded))
    if mb.mode == ULYSSES:
        a2a, heads = start.comm_a2a, start.heads
        if a2a is None or heads is None:
            raise FitError(f"calibration: a ulysses microbatch measured, but {start.name} has no comm_a2a/heads")
        copies = math.lcm(heads.kv, n) // heads.kv
        per_token = a2a.bytes_per_token + a2a.kv_bytes_per_token * (copies - 1)
        mib = tokens / n * per_token / MIB
    else:
        mib = tokens * start.comm.bytes_per_token / MIB
    return mib * (n - 1) / n if start.topology is not None else mib


def _starting_value(start: Profile, term: _Term) -> float:
    if term.mode == ALLGATHER:
        if term.fixed:
            return start.comm.fixed_ms
        if term.link is not None and start.topology is not None:
            return start.topology.link(term.link).allgather_ms_per_mib
        return start.comm.ms_per_mib
    a2a = start.comm_a2a
    assert a2a is not None, "ulysses rows need comm_a2a (comm_mib checks)"
    if term.fixed:
        return a2a.fixed_ms
    if term.link is not None and start.topology is not None:
        return start.topology.link(term.link).alltoall_ms_per_mib
    return a2a.ms_per_mib


def _columns(
    start: Profile, mbs: Sequence[MeasuredMicrobatch], terms: Sequence[_Term], coef: np.ndarray | None
) -> np.ndarray:
    """One row per microbatch: ``tokens``, ``tokens_sq``, ``1``, then one column per communication term (its
    MiB, or an indicator for a fixed cost), linearised at ``coef`` (the previous round's fit; None: the
    first round, which takes every collective as showing).

    The rows follow the overlap the worker runs (worker/dacp.py; the profile section ``overlap``), each
    direction on its own as solver/cost.py prices it (module doc there, "Overlap"):
    ``sum_d max(h_d (1-e) T_comm, s_d A_j) + e T_comm + (T_comp(local_j) - A_j) + T_comp(sharded / N)``,
    ``d`` forward and backward, ``A_j`` the local attention, ``s_d`` its share in direction ``d`` (2/7 : 5/7,
    ``ATTENTION_BACKWARD_PER_FORWARD``), ``h_d`` the hidden communication's (``hidden_forward_share``: 1/2 for
    all-gather), ``e`` the exposed share (0 for all-gather, the profile's ``overlap.ulysses_exposed`` or
    ``ULYSSES_EXPOSED`` for Ulysses). Of each ``max``, the row keeps the side that dominates at ``coef``, on
    the GPU whose time is the largest there (module doc)."""
    # the overlap the worker runs (worker/dacp.py), whatever the starting profile prices: a collective hides
    # behind the local attention only, and half of Ulysses' exchanges (the second in each direction) never do
    overlap = getattr(start, "overlap", None)
    shares = CostModel(start)
    rows = []
    for mb in mbs:
        n = len(mb.ranks)
        tok_sh = sum(mb.sharded) / n
        sq_sh = sum(s * s for s in mb.sharded) / n
        mib = comm_mib(start, mb)
        link = _link(start, mb.ranks)
        comm_cols = [
            (
                (1.0 if term.fixed else mib)
                if mb.communicates and mb.mode == term.mode and (term.fixed or term.link == link)
                else 0.0
            )
            for term in terms
        ]
        exposed = float(getattr(overlap, "ulysses_exposed", ULYSSES_EXPOSED)) if mb.mode == ULYSSES else 0.0
        comm_fwd = shares.hidden_forward_share(n, mb.mode)
        best: list[float] | None = None
        best_ms = -1.0
        for lens in mb.local:
            tok_l, sq_l = float(sum(lens)), float(sum(s * s for s in lens))
            # per direction: (hidden communication share, local attention share) of the worker's two overlaps
            sq_shown, comm_shown = sq_l, exposed
            for comm_share, attention_share in ((comm_fwd, ATTENTION_FWD), (1.0 - comm_fwd, 1.0 - ATTENTION_FWD)):
                if coef is None:  # first round: the collective shows (the local attention under it is short)
                    hidden = not mb.communicates
                else:
                    comm = float(np.dot(coef[3:], comm_cols))
                    hidden = comm_share * (1 - exposed) * comm <= attention_share * coef[1] * sq_l
                if not hidden:  # this direction's exchange shows whole; its local attention under it does not
                    sq_shown -= attention_share * sq_l
                    comm_shown += comm_share * (1 - exposed)
            row = [tok_l + tok_sh, sq_shown + sq_sh, 1.0, *(comm_shown * c for c in comm_cols)]
            ms = float(np.dot(coef, row)) if coef is not None else tok_l
            if ms > best_ms:
                best, best_ms = row, ms
        assert best is not None, "a microbatch has at least one GPU"
        rows.append(best)
    return np.asarray(rows, dtype=np.float64)


def _identified(cols: np.ndarray, j: int) -> str | None:
    """Why column ``j`` cannot be fitted from these rows (None: it can)."""
    shown = cols[:, j] > 0
    if int(shown.sum()) < MIN_COMMUNICATING:
        return f"{int(shown.sum())} microbatch(es) showed it, fewer than {MIN_COMMUNICATING}"
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationFit:
    profile: dict[str, Any]
    used: int
    dropped: int
    median_abs_rel_error: float
    #: coefficients the run could not identify, kept at the starting profile's value: name -> why
    kept: Mapping[str, str] = field(default_factory=dict)


def fittable(mbs: Sequence[MeasuredMicrobatch], warmup_iterations: int) -> list[MeasuredMicrobatch]:
    """The microbatches a fit uses: those after the first ``warmup_iterations`` iterations, with a finite
    timing of at least ``MIN_TIMING_MS``."""
    first = min((mb.iteration for mb in mbs), default=0)
    return [
        mb
        for mb in mbs
        if mb.iteration >= first + warmup_iterations and math.isfinite(mb.ms) and mb.ms >= MIN_TIMING_MS
    ]


def fit_profile(
    start: Profile,
    mbs: Sequence[MeasuredMicrobatch],
    *,
    warmup_iterations: int = WARMUP_ITERATIONS,
    half_life_iterations: float | None = HALF_LIFE_ITERATIONS,
    provenance: Mapping[str, Any] | None = None,
) -> CalibrationFit:
    """Refit ``start``'s time coefficients on measured microbatches (module doc); memory and topology are kept,
    a fitted link coefficient written into the link the run used.

    ``half_life_iterations``: the recency weighting (module doc); None weighs every iteration alike."""
    if half_life_iterations is not None and not half_life_iterations > 0:
        raise ValueError(f"half_life_iterations must be > 0 or None, got {half_life_iterations}")
    data = fittable(mbs, warmup_iterations)
    if len(data) < MIN_MICROBATCHES:
        raise FitError(f"calibration: need at least {MIN_MICROBATCHES} microbatches after warm-up, got {len(data)}")
    ys = np.asarray([mb.ms for mb in data])
    latest = max(mb.iteration for mb in data)
    # row factors: squared in the objective, so sqrt of the weight 2^(-age / half-life)
    recency = (
        np.ones(len(data))
        if half_life_iterations is None
        else np.asarray([2.0 ** (-(latest - mb.iteration) / (2.0 * half_life_iterations)) for mb in data])
    )
    # one MiB and one fixed term per collective the run used, the MiB one per link with a topology
    shown = {(mb.mode, _link(start, mb.ranks)) for mb in data if mb.communicates}
    terms = [_Term(mode=m, link=link, fixed=False) for m, link in sorted(shown, key=str)]
    terms += [_Term(mode=m, link=None, fixed=True) for m in sorted({m for m, _ in shown})]
    cols = _columns(start, data, terms, None)
    kept: dict[str, str] = {}
    for j, term in enumerate(terms):
        why = _identified(cols, 3 + j)
        if why is not None:
            kept[term.name] = why
    # a fixed cost and a per-MiB cost of the same collective cannot be told apart when the MiB hardly vary
    for term in terms:
        if term.fixed and term.name not in kept:
            mibs = [cols[cols[:, 3 + i] > 0, 3 + i] for i, t in enumerate(terms) if t.mode == term.mode and not t.fixed]
            values = np.concatenate(mibs) if mibs else np.zeros(0)
            if values.size and values.max() < MIN_MIB_SPREAD * values.min():
                kept[term.name] = "the run's MiB varied too little to tell the fixed cost from the per-MiB one"
    start_coef = np.asarray([_starting_value(start, t) for t in terms])
    keep = np.ones(len(data), dtype=bool)
    irls = np.ones(len(data))
    fpt = start.compute.flops_per_token
    coef: np.ndarray | None = None
    for _ in range(IRLS_ROUNDS):  # least absolute relative error, by iteratively reweighted least squares
        cols = _columns(start, data, terms, coef)
        # a term hidden under local work in every kept microbatch shows nowhere: it keeps its start this round
        hidden = {t.name for j, t in enumerate(terms) if not (cols[keep, 3 + j] > 0).any()} - set(kept)
        fitted = [0, 1, 2] + [3 + j for j, t in enumerate(terms) if t.name not in kept and t.name not in hidden]
        pinned = [3 + j for j, t in enumerate(terms) if t.name in kept or t.name in hidden]
        coef = np.zeros(cols.shape[1])
        coef[pinned] = start_coef[[j - 3 for j in pinned]]
        # the pinned terms at their starting values; the rest fitted to what they leave, weighed by the
        # whole time (a relative fit)
        rest = np.maximum(ys - cols[:, pinned] @ coef[pinned], 1e-3 * ys)
        row = irls * recency * rest / ys
        coef[fitted], _ = fit_nonnegative(cols[keep][:, fitted], rest[keep], what="calibration", weights=row[keep])
        rel = np.abs(cols @ coef - ys) / ys
        irls = 1.0 / np.sqrt(np.maximum(rel, 0.01))  # row factor: squared, it weighs r^2 by 1/|r|
        keep = rel <= max(4.0 * float(np.median(rel)), 0.25)
        if keep.sum() < MIN_MICROBATCHES:
            keep = np.ones(len(data), dtype=bool)
    assert coef is not None
    for name in hidden:
        kept[name] = "hidden under the local work of every microbatch that ran it"
    a, b, c = (float(x) for x in coef[:3])
    ms_per_tflop = a * 1e12 / fpt
    residual = float(np.median(np.abs(cols[keep] @ coef - ys[keep]) / ys[keep]))
    doc = start.to_dict()
    for key in ("check", "estimated", "measured"):  # what described the starting profile no longer holds
        doc.pop(key, None)
    doc["name"] = f"{start.name}+calibrated"
    doc["estimated"] = False
    doc["compute"] = {
        "flops_per_token": fpt,
        "flops_per_token_sq": b * 1e12 / ms_per_tflop,
        "ms_per_tflop": ms_per_tflop,
        "fixed_ms": 0.0,
        "source": "calibrated from the run (worker/calibration.py): a * tokens + b * tokens^2 of the critical GPU",
    }
    calibrated_terms = {}
    sources: dict[str, list[str]] = {}
    for j, term in enumerate(terms):
        value = float(coef[3 + j])
        calibrated_terms[term.name] = value
        section = "comm" if term.mode == ALLGATHER else "comm_a2a"
        how = (
            f"kept from {start.name}: {kept[term.name]}"
            if term.name in kept
            else f"calibrated from the run's {term.mode} microbatches (worker/calibration.py)"
        )
        if term.fixed:
            doc[section]["fixed_ms"] = value
        elif term.link is None:
            doc[section]["ms_per_mib"] = value
        else:
            doc["topology"][term.link]["allgather_ms_per_mib" if term.mode == ALLGATHER else "alltoall_ms_per_mib"] = (
                value
            )
        sources.setdefault("topology" if term.link is not None and not term.fixed else section, []).append(
            f"{term.name}: {how}"
        )
    for section, lines in sources.items():
        doc[section]["source"] = "; ".join(lines) + (
            f" (before: {doc[section]['source']})" if doc[section].get("source") else ""
        )
    # the terms the run never showed keep the starting profile's values as they are (never scaled by another
    # coefficient's ratio: a slower compute says nothing of a link)
    for mode, section in ((ALLGATHER, "comm"), (ULYSSES, "comm_a2a")):
        if section in doc and not any(t.mode == mode for t in terms):
            kept[f"{section}.*"] = "the run had no communicating microbatch of this mode"
    doc["microbatch_ms"] = c
    doc["calibrated"] = {
        "from": start.name,
        "microbatches": int(keep.sum()),
        "dropped_outliers": int((~keep).sum()),
        "warmup_iterations": warmup_iterations,
        "half_life_iterations": half_life_iterations,
        "iterations": sorted({mb.iteration for mb in data}),
        "median_abs_rel_error": round(residual, 6),
        "communication": {name: round(v, 9) for name, v in calibrated_terms.items()},
        "kept_starting": dict(kept),
        "samples": {
            "columns": ["tokens", "tokens_sq", "communication_ms", "communicates", "ms", "kept"],
            "rows": [
                [
                    round(float(row[0]), 6),
                    round(float(row[1]), 6),
                    round(float(row[3:] @ coef[3:]), 6),
                    bool(row[3:].any()),
                    round(float(y), 4),
                    bool(k),
                ]
                for row, y, k in zip(cols[-512:], ys[-512:], keep[-512:], strict=True)
            ],
        },
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        **dict(provenance or {}),
    }
    if kept:
        logging.getLogger("skrull.calibration").info(
            "calibration kept the starting profile's %s", "; ".join(f"{k} ({v})" for k, v in kept.items())
        )
    profile_from_dict(doc)  # the specification's reader must accept it
    return CalibrationFit(
        profile=doc, used=int(keep.sum()), dropped=int((~keep).sum()), median_abs_rel_error=residual, kept=kept
    )


#: Fewest microbatches per fitted coefficient, and fewest iterations, from which a noise floor is not flagged
#: optimistic: with the model's form exactly right and 12% per-microbatch noise, the in-sample floor of 8-10
#: microbatches came out at 5.7-7.3% where the true model missed 9.5%; from 40 on it was within 0.5 point.
FLOOR_MICROBATCHES_PER_COEFFICIENT = 4
FLOOR_MIN_ITERATIONS = 5
#: Most microbatches a noise floor is fitted on, the latest (1.5 s for 16,384 on a 2-core VM): a long run's
#: whole history would make the run's last line wait on one large fit.
FLOOR_MAX_MICROBATCHES = 16384


@dataclass(frozen=True, slots=True, kw_only=True)
class NoiseFloor:
    """What the model's form, fitted to a run, still misses of that same run: the machine's spread, or a term
    the model lacks.

    The calibration's fit (``fit_profile``: least absolute relative error per microbatch, non-negative, terms the
    run cannot identify kept at their start) made on every measured microbatch after warm-up, weighing every
    iteration alike, and judged on those same microbatches (in sample). It is not a bound: the fit does not
    minimise the iteration error, so an out-of-sample iteration figure can land a little under it. Read beside
    the summary's out-of-sample figures: near the floor, the calibration carried over to the later iterations
    and what is left was there even with every timing in hand; well above it, it did not (drift, or too little
    data for the fit). Whether what is left is the machine or a missing term the floor cannot say: a missing
    term shows as one kind of microbatch (local, sharded, mixed; a group size) missed one way, which
    ``--calibration-records-out`` lets a reader check (bench/calibration_comm.py prints it by kind); noise
    misses every kind both ways.

    In sample it is optimistic when the microbatches are few against the coefficients fitted (``optimistic``):
    with fewer than ``FLOOR_MICROBATCHES_PER_COEFFICIENT`` per coefficient or ``FLOOR_MIN_ITERATIONS``
    iterations the line says so.

    On a 2-core VM with 2 gloo processes and 3-35 ms microbatches, quiet (load about 1;
    bench/calibration_comm.py without an injected delay, 27 runs of 76 microbatches), the floor was a median
    12.5% per microbatch (8.7-23.1%) and 8.4% per iteration (2.7-17.6%), with measured / estimated 1.00-1.10 by
    kind of microbatch (nothing one-sided): whole iterations of one run ran at speeds up to 1.2-2.3x apart,
    while one process timing one microbatch alone on that machine had a median absolute deviation of 1.5%."""

    microbatch_error: float  # median over the microbatches of |estimated - measured| / measured
    iteration_error: float  # median over the iterations, the slowest GPU's sums (``iteration_times``)
    microbatches: int
    iterations: int
    coefficients: int  # fitted (3 compute terms and the communication terms the run identified)

    @property
    def optimistic(self) -> bool:
        return (
            self.microbatches < FLOOR_MICROBATCHES_PER_COEFFICIENT * self.coefficients
            or self.iterations < FLOOR_MIN_ITERATIONS
        )

    def line(self) -> str:
        few = "; optimistic: too few microbatches or iterations to judge" if self.optimistic else ""
        return (
            f"calibration noise floor: {self.microbatch_error:.1%} per microbatch, {self.iteration_error:.1%} per "
            f"iteration (the model's {self.coefficients} coefficients fitted to this run's {self.microbatches} "
            f"microbatches of {self.iterations} iterations and judged on them: what its form misses here, the "
            f"machine's spread or a term it lacks{few})"
        )


def noise_floor(
    start: Profile | str | Mapping[str, Any],
    mbs: Sequence[MeasuredMicrobatch],
    *,
    warmup_iterations: int = WARMUP_ITERATIONS,
) -> NoiseFloor | None:
    """The run's noise floor (``NoiseFloor``) over its latest ``FLOOR_MAX_MICROBATCHES`` microbatches (whole
    iterations); None when fewer than ``MIN_MICROBATCHES`` were measured after warm-up (no fit)."""
    data = fittable(mbs, warmup_iterations)
    if len(data) > FLOOR_MAX_MICROBATCHES:  # one fit is linear in its rows: 6 s for 65,536 on a 2-core VM
        cut = sorted(mb.iteration for mb in data)[-FLOOR_MAX_MICROBATCHES]
        data = [mb for mb in data if mb.iteration > cut] or [mb for mb in data if mb.iteration == cut]
    try:
        fit = fit_profile(starting_profile(start), data, warmup_iterations=0, half_life_iterations=None)
    except FitError:
        return None
    model = CostModel(profile_from_dict(fit.profile))
    fitted_comm = [name for name in fit.profile["calibrated"]["communication"] if name not in fit.kept]
    return NoiseFloor(
        microbatch_error=median_error(data, model),
        iteration_error=iteration_error(data, model),
        microbatches=len(data),
        iterations=len({mb.iteration for mb in data}),
        coefficients=3 + len(fitted_comm),
    )


def starting_profile(profile: str | Mapping[str, Any] | Profile) -> Profile:
    """A profile given by bundled name, document or as read."""
    if isinstance(profile, Profile):
        return profile
    return load_profile(profile) if isinstance(profile, str) else profile_from_dict(dict(profile))


class Calibration:
    """Measured microbatches of a run and the profile refitted on them (what the planner process keeps)."""

    #: rank timings kept (the latest): bounds the refit's work in a long run
    MAX_TIMINGS = 16384

    def __init__(
        self,
        profile: str | Mapping[str, Any],
        *,
        warmup_iterations: int = WARMUP_ITERATIONS,
        provenance: Mapping[str, Any] | None = None,
    ) -> None:
        self.start = starting_profile(profile)
        self.warmup_iterations = warmup_iterations
        self.provenance = dict(provenance or {})
        self.timings: list[RankTiming] = []
        self.fitted: CalibrationFit | None = None
        self.fitted_at: float | None = None

    def add(self, timings: Iterable[RankTiming]) -> None:
        self.timings.extend(timings)
        if len(self.timings) > self.MAX_TIMINGS:  # the latest: a long run refits on its recent steps
            cut = self.timings[-self.MAX_TIMINGS - 1].iteration
            del self.timings[: -self.MAX_TIMINGS]
            # whole iterations only: a member's start in its iteration is the sum of its earlier parts there
            self.timings = [t for t in self.timings if t.iteration != cut]

    @property
    def microbatches(self) -> list[MeasuredMicrobatch]:
        return measured_microbatches(self.timings)

    def refit(self) -> CalibrationFit | None:
        """Refit on everything measured so far; None (and the previous fit kept) when too little is known."""
        try:
            self.fitted = fit_profile(
                self.start, self.microbatches, warmup_iterations=self.warmup_iterations, provenance=self.provenance
            )
        except FitError:
            return self.fitted
        self.fitted_at = time.time()
        return self.fitted

    def report_line(self, *, before: CostModel | None = None) -> str:
        """``calibration: median microbatch error X% -> Y% over N microbatches; iteration estimate error A% -> B%``."""
        mbs = [mb for mb in self.microbatches if mb.iteration >= min(m.iteration for m in self.microbatches)]
        start = before or CostModel(self.start)
        fitted = self.fitted or self.refit()
        after = CostModel(profile_from_dict(fitted.profile)) if fitted else start
        return (
            f"calibration: median microbatch error {median_error(mbs, start):.1%} -> {median_error(mbs, after):.1%} "
            f"over {len(mbs)} microbatches; iteration estimate error {iteration_error(mbs, start):.1%} -> "
            f"{iteration_error(mbs, after):.1%}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationReport:
    """One iteration: its estimated time under the profile its plan was made with, the measured time (both
    the slowest GPU's sum over its microbatches), and the median per-microbatch error."""

    iteration: int
    profile: str
    estimated_ms: float
    measured_ms: float
    median_microbatch_error: float
    microbatches: int

    @property
    def iteration_error(self) -> float:
        return abs(self.estimated_ms - self.measured_ms) / self.measured_ms if self.measured_ms > 0 else float("nan")


def _profile_name(profile: Any) -> str:
    return profile if isinstance(profile, str) else str(profile.get("name", "inline"))


class LoaderCalibration:
    """The planned loader's side of calibration (``LoaderOptions(calibrate=True)``).

    After each step every rank hands in its microbatch times (``record``): they are gathered over the job
    (``all_gather_object``), so every rank holds the same measurements; the loader of local rank 0 sends
    them to its node's planner process, which refits (``Calibration``). The profile of each later request
    is the planner's current fit, agreed over the job's store (``compare_set``: the first proposal of a
    request wins), so every rank and node asks for the same plan. With a plan source other than the
    planner process (``LocalPlans``, a service), the fit runs in this process.
    """

    def __init__(self, loader: Any, *, store: Any) -> None:
        self.loader = loader
        self.store = store
        self.start = loader.profile
        # a plan source that fits in its own process (worker/planner/client.ProcessPlans), recognised by
        # what it does rather than imported: the planner package imports this module
        plans = loader.plans
        fits_remotely = hasattr(plans, "add_timings") and hasattr(plans, "calibrated_profile")
        self.remote = plans if fits_remotely else None
        self.local = None if self.remote is not None else Calibration(loader.profile)
        self.key = f"skrull/plan-profile/{loader.job_key}/{loader.instance}"
        #: the profile each request ("epoch/chunk") was planned with
        self.profiles: dict[str, Any] = {}
        #: every measured microbatch with the profile its plan was made with
        self.measured: list[tuple[MeasuredMicrobatch, Any]] = []
        self.reports: list[CalibrationReport] = []
        self._models: dict[str, CostModel] = {}

    def _model(self, profile: Any) -> CostModel:
        key = _profile_name(profile) if isinstance(profile, str) else repr(sorted(profile.get("compute", {}).items()))
        if key not in self._models:
            self._models[key] = CostModel(starting_profile(profile), bucket_tokens=self.loader.bucket_tokens)
        return self._models[key]

    def fitted_profile(self) -> dict[str, Any] | None:
        if self.remote is not None:
            fitted: dict[str, Any] | None = self.remote.calibrated_profile()
            return fitted
        assert self.local is not None
        return self.local.fitted.profile if self.local.fitted is not None else None

    def profile_for(self, request: str) -> Any:
        """The profile ``request`` ("epoch/chunk") is planned with: the latest fit, or the starting profile."""
        if request in self.profiles:
            return self.profiles[request]
        proposal: Any = self.fitted_profile() or self.start
        if self.store is not None:
            import json

            agreed = self.store.compare_set(f"{self.key}/{request}", "", json.dumps(proposal, sort_keys=True))
            proposal = json.loads(agreed.decode() if isinstance(agreed, bytes) else agreed)
        self.profiles[request] = proposal
        return proposal

    def record(self, ready: Any, microbatch_ms: Sequence[float]) -> CalibrationReport:
        import torch.distributed as dist

        mine = [t.to_list() for t in rank_timings(ready.iteration, ready.microbatches, microbatch_ms)]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, mine)
            rows = [RankTiming.from_list(r) for part in gathered for r in part]
        else:
            rows = [RankTiming.from_list(r) for r in mine]
        if self.remote is not None:
            if self.remote.owner:
                self.remote.add_timings(rows, profile=self.start)
        else:
            assert self.local is not None
            self.local.add(rows)
            self.local.refit()
        mbs = measured_microbatches(rows)
        chunk = ready.iteration // self.loader.batches_per_plan
        profile = self.profiles.get(f"{self.loader.epoch}/{chunk}", self.start)
        self.measured.extend((mb, profile) for mb in mbs)
        report = iteration_report(ready.iteration, mbs, profile, self._model(profile))
        self.reports.append(report)
        logging.getLogger("skrull.calibration").info(
            "iteration %d (%s): estimated %.1f ms, measured %.1f ms; median microbatch error %.1f%% over %d",
            report.iteration, report.profile, report.estimated_ms, report.measured_ms,
            100 * report.median_microbatch_error, report.microbatches,
        )  # fmt: skip
        return report

    def summary_line(self) -> str:
        """The run's one-line summary (``summary_line``)."""
        return summary_line(self.start, self.measured, self.reports, self.fitted_profile())

    def noise_floor(self) -> NoiseFloor | None:
        """The run's noise floor (``noise_floor``): what the model's form, fitted to these very timings, still
        misses of them."""
        return noise_floor(self.start, [mb for mb, _ in self.measured])


def summary_line(
    start: Any,
    measured: Sequence[tuple[MeasuredMicrobatch, Any]],
    reports: Sequence[CalibrationReport],
    fitted: Mapping[str, Any] | None,
) -> str:
    """``calibration: median microbatch error X% -> Y% over N microbatches; iteration estimate error A% -> B%``.

    X and A: the estimates of the iterations planned with the starting profile; Y and B: those of the
    iterations planned with a calibrated one, each measured after its fit (out of sample). Before any
    calibrated iteration ran, Y and B are the latest fit's, in sample.
    """
    start_name = _profile_name(start)
    start_model = CostModel(starting_profile(start))
    before = [mb for mb, p in measured if _profile_name(p) == start_name]
    after = [(mb, p) for mb, p in measured if _profile_name(p) != start_name]
    x, a = median_error(before, start_model), iteration_error(before, start_model)
    if after:
        models: dict[str, CostModel] = {}
        errors = []
        for mb, p in after:
            key = repr(sorted(p.get("compute", {}).items())) + repr(p.get("microbatch_ms"))
            model = models.setdefault(key, CostModel(starting_profile(p)))
            errors.append(abs(estimate_ms(model, mb) - mb.ms) / mb.ms)
        y = float(statistics.median(errors))
        b = float(statistics.median(r.iteration_error for r in reports if r.profile != start_name))
    else:
        model = CostModel(starting_profile(fitted)) if fitted else start_model
        every = [mb for mb, _ in measured]
        y, b = median_error(every, model), iteration_error(every, model)
    return (
        f"calibration: median microbatch error {x:.1%} -> {y:.1%} over {len(measured)} microbatches; "
        f"iteration estimate error {a:.1%} -> {b:.1%}"
    )


def iteration_report(
    iteration: int, mbs: Sequence[MeasuredMicrobatch], profile: Any, model: CostModel
) -> CalibrationReport:
    """The report of one iteration's measured microbatches against the profile its plan was made with."""
    est, meas = iteration_times(mbs, model).get(iteration, (0.0, 0.0))
    return CalibrationReport(
        iteration=iteration, profile=_profile_name(profile), estimated_ms=est, measured_ms=meas,
        median_microbatch_error=median_error(mbs, model), microbatches=len(mbs),
    )  # fmt: skip

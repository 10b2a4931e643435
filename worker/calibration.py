"""Calibration from the run: the cost model refitted on the microbatches training really ran.

A profile is fitted once, offline, on one decoder layer (``skrull profile``), or derived from datasheets;
a planner optimises the model it is given, so a wrong model makes it trade the wrong things (on one H100,
whole planned steps took 11-15% longer than estimated). Here every rank times each of its microbatches
(CUDA events on a GPU, ``perf_counter`` after a device synchronisation on a CPU; ``MicrobatchTimer``)
and reports, with each time, what the reference cost model prices (docs/formats.md): the group of the
microbatch, the lengths kept whole on each of its GPUs and the lengths sharded over it. Gathered over
the job, the ranks' parts of one microbatch make one measurement, its time the slowest member's (the
group waits for it in its collectives, as the model's ``max_j`` says).

The fit (``fit_profile``) is ``fit_nonnegative`` of worker/profiling/fit.py, the same relative,
non-negative least squares ``skrull profile`` fits its compute with, over one row per microbatch::

    ms = a * tokens + b * tokens_sq + m * sharded_MiB + f * [sharded] + c

with ``tokens`` and ``tokens_sq`` the token and squared-token work of the microbatch's critical GPU
(its local sequences whole, plus each sharded sequence's ``S / N`` and ``S^2 / N``: eqs. 3-5), the K/V
bytes of the sharded tokens (eq. 16), an indicator of communication, and one per microbatch. The
coefficients map onto the profile's: ``ms_per_tflop = a * 1e12 / flops_per_token`` (the FLOP count per
token is the starting profile's, so ``ms_per_tflop * FLOPs`` reproduces the fit), ``flops_per_token_sq =
b * 1e12 / ms_per_tflop``, ``comm.ms_per_mib = m``, ``comm.fixed_ms = f``, ``microbatch_ms = c`` and
``compute.fixed_ms = 0`` (the per-microbatch constant takes it: a microbatch with both local and sharded
work would otherwise pay it twice). The critical GPU is the one with the most local work under the
previous fit (each reweighting round). Terms the run did not show are not fitted: with fewer than
``MIN_COMMUNICATING`` microbatches sharded over a group, the communication coefficients are the starting
profile's scaled by the compute's ratio (the machine is as much slower), the fixed cost taken from the
median excess time of the few that did communicate, if any, so a planner is not told that communication
it hardly measured is free. From ``MIN_COMMUNICATING`` on, the communication terms are fitted and then
shrunk towards that scaled start as a prior worth ``MIN_COMMUNICATING`` microbatches: with ``n``
communicating microbatches, ``m = (n * m_fit + MIN_COMMUNICATING * m_start) / (n + MIN_COMMUNICATING)``,
``f`` alike. A few noisy communicating microbatches otherwise let the non-negative fit call communication
free (in bench/calibration.py on the shared 2-core VM, of nine runs fitted on 4-9 of them, all nine said
``m = 0`` and seven ``m = f = 0``; the planner then shards as if gathers cost nothing); as they
accumulate the run's own figures take over (40 of them weigh 91%). The model's ``max(T_comm,
T_comp_local)`` is fitted as a sum: exact when a sharded microbatch has no local work (DACP's usual case),
an upper bound otherwise.

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
import platform
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from skrull.solver.cost import CostModel
from skrull.solver.profile import Profile, load_profile, profile_from_dict
from skrull.worker.profiling.fit import MIB, FitError, fit_nonnegative

#: Iterations left out of every fit: the first run of every kernel and allocation is slower.
WARMUP_ITERATIONS = 1
#: Fewest microbatches a fit is made from.
MIN_MICROBATCHES = 6
#: Fewest communicating microbatches (sharded over a group) the communication terms are fitted from.
MIN_COMMUNICATING = 4
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

    def to_list(self) -> list[Any]:
        return [self.iteration, self.step, list(self.ranks), self.position, list(self.local_lengths),
                list(self.sharded_lengths), self.ms]  # fmt: skip

    @classmethod
    def from_list(cls, row: Sequence[Any]) -> RankTiming:
        it, step, ranks, position, local, sharded, ms = row
        return cls(
            iteration=int(it), step=int(step), ranks=tuple(int(r) for r in ranks), position=int(position),
            local_lengths=tuple(int(s) for s in local), sharded_lengths=tuple(int(s) for s in sharded), ms=float(ms),
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


def measured_microbatches(timings: Iterable[RankTiming]) -> list[MeasuredMicrobatch]:
    """Group the ranks' parts by microbatch; a microbatch some member did not report is left out."""
    groups: dict[tuple[int, int, tuple[int, ...]], dict[int, RankTiming]] = {}
    for t in timings:
        groups.setdefault((t.iteration, t.step, t.ranks), {})[t.position] = t
    out = []
    for (iteration, step, ranks), parts in sorted(groups.items()):
        if len(parts) != len(ranks):
            continue
        first = parts[0]
        out.append(
            MeasuredMicrobatch(
                iteration=iteration, step=step, ranks=ranks,
                local=tuple(parts[p].local_lengths for p in range(len(ranks))), sharded=first.sharded_lengths,
                ms=max(p.ms for p in parts.values()),
            )
        )  # fmt: skip
    return out


def estimate_ms(model: CostModel, mb: MeasuredMicrobatch) -> float:
    """The reference model's time of a measured microbatch (exactly what a plan's ``estimated_ms`` says)."""
    return model.microbatch_time_ms(mb.local, mb.sharded)


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


def _columns(mbs: Sequence[MeasuredMicrobatch], bytes_per_token: float, weights: tuple[float, float]) -> np.ndarray:
    a, b = weights
    rows = []
    for mb in mbs:
        n = len(mb.ranks)
        tok_sh = sum(mb.sharded) / n
        sq_sh = sum(s * s for s in mb.sharded) / n
        best = max(mb.local, key=lambda lens: a * sum(lens) + b * sum(s * s for s in lens))
        tokens = sum(best) + tok_sh
        tokens_sq = sum(s * s for s in best) + sq_sh
        comm = n > 1 and bool(mb.sharded)
        mib = sum(mb.sharded) * bytes_per_token / MIB if comm else 0.0
        rows.append([tokens, tokens_sq, mib, 1.0 if comm else 0.0, 1.0])
    return np.asarray(rows, dtype=np.float64)


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationFit:
    profile: dict[str, Any]
    used: int
    dropped: int
    median_abs_rel_error: float


def fit_profile(
    start: Profile,
    mbs: Sequence[MeasuredMicrobatch],
    *,
    warmup_iterations: int = WARMUP_ITERATIONS,
    half_life_iterations: float | None = HALF_LIFE_ITERATIONS,
    provenance: Mapping[str, Any] | None = None,
) -> CalibrationFit:
    """Refit ``start``'s time coefficients on measured microbatches (module doc); memory is kept.

    ``half_life_iterations``: the recency weighting (module doc); None weighs every iteration alike."""
    if half_life_iterations is not None and not half_life_iterations > 0:
        raise ValueError(f"half_life_iterations must be > 0 or None, got {half_life_iterations}")
    first = min((mb.iteration for mb in mbs), default=0)
    data = [mb for mb in mbs if mb.iteration >= first + warmup_iterations and mb.ms > 0]
    if len(data) < MIN_MICROBATCHES:
        raise FitError(f"calibration: need at least {MIN_MICROBATCHES} microbatches after warm-up, got {len(data)}")
    bpt = start.comm.bytes_per_token
    ys = np.asarray([mb.ms for mb in data])
    latest = max(mb.iteration for mb in data)
    # row factors: squared in the objective, so sqrt of the weight 2^(-age / half-life)
    recency = (
        np.ones(len(data))
        if half_life_iterations is None
        else np.asarray([2.0 ** (-(latest - mb.iteration) / (2.0 * half_life_iterations)) for mb in data])
    )
    weights = (1.0, 0.0)
    keep = np.ones(len(data), dtype=bool)
    irls = np.ones(len(data))
    # communication is fitted only when the run showed it: else the starting profile's, scaled (below)
    communicating = sum(1 for mb in data if len(mb.ranks) > 1 and mb.sharded)
    active = [0, 1, 2, 3, 4] if communicating >= MIN_COMMUNICATING else [0, 1, 4]
    fpt = start.compute.flops_per_token
    for _ in range(IRLS_ROUNDS):  # least absolute relative error, by iteratively reweighted least squares
        cols = _columns(data, bpt, weights)
        coef = np.zeros(cols.shape[1])
        row = irls * recency
        coef[active], _ = fit_nonnegative(cols[keep][:, active], ys[keep], what="calibration", weights=row[keep])
        weights = (float(coef[0]), float(coef[1]))
        rel = np.abs(cols @ coef - ys) / ys
        irls = 1.0 / np.sqrt(np.maximum(rel, 0.01))  # row factor: squared, it weighs r^2 by 1/|r|
        keep = rel <= max(4.0 * float(np.median(rel)), 0.25)
        if keep.sum() < MIN_MICROBATCHES:
            keep = np.ones(len(data), dtype=bool)
    a, b, m, f, c = (float(x) for x in coef)
    ms_per_tflop = a * 1e12 / fpt
    comm_source = "calibrated from the run: sharded K/V MiB and an indicator of communication per microbatch"
    ratio = ms_per_tflop / start.compute.ms_per_tflop
    if 2 in active:  # fitted, and shrunk towards the scaled start by as much as the few rows weigh (module doc)
        share = communicating / (communicating + MIN_COMMUNICATING)
        m = share * m + (1 - share) * start.comm.ms_per_mib * ratio
        f = share * f + (1 - share) * start.comm.fixed_ms * ratio
        comm_source += (
            f", {communicating} microbatches weighing {share:.0%} against the starting profile's x {ratio:.4g} "
            f"(the compute's ratio), worth {MIN_COMMUNICATING}"
        )
    else:  # not shown by the run: the machine is as much slower as its compute
        m, f = start.comm.ms_per_mib * ratio, start.comm.fixed_ms * ratio
        comm_source = (
            f"the starting profile's, x {ratio:.4g} (the compute's ratio): only {communicating} microbatch(es) "
            f"of the run communicated, fewer than {MIN_COMMUNICATING}"
        )
        shown = cols[:, 3] > 0
        if shown.any():  # what the few that did communicate show of the fixed cost
            excess = ys[shown] - cols[shown] @ np.asarray([a, b, m, 0.0, c])
            f = max(0.0, float(np.median(excess)))
            comm_source += f"; fixed_ms the median excess time of those {int(shown.sum())}"
    coef = np.asarray([a, b, m, f, c])
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
    doc["comm"] = {
        "bytes_per_token": bpt,
        "ms_per_mib": m,
        "fixed_ms": f,
        "source": comm_source,
    }
    doc["microbatch_ms"] = c
    doc["calibrated"] = {
        "from": start.name,
        "microbatches": int(keep.sum()),
        "dropped_outliers": int((~keep).sum()),
        "warmup_iterations": warmup_iterations,
        "half_life_iterations": half_life_iterations,
        "iterations": sorted({mb.iteration for mb in data}),
        "median_abs_rel_error": round(residual, 6),
        "samples": {
            "columns": ["tokens", "tokens_sq", "sharded_mib", "communicates", "ms", "kept"],
            "rows": [
                [*(round(float(x), 6) for x in row), round(float(y), 4), bool(k)]
                for row, y, k in zip(cols[-512:, :4], ys[-512:], keep[-512:], strict=True)
            ],
        },
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        **dict(provenance or {}),
    }
    profile_from_dict(doc)  # the specification's reader must accept it
    return CalibrationFit(profile=doc, used=int(keep.sum()), dropped=int((~keep).sum()), median_abs_rel_error=residual)


def starting_profile(profile: str | Mapping[str, Any]) -> Profile:
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
        del self.timings[: -self.MAX_TIMINGS]  # the latest: a long run refits on its recent steps

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
    """The planned loader's side of calibration (``PlannedBatches(calibrate=True)``).

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
        # a plan source that fits in its own process (worker/planner_process.ProcessPlans), recognised by
        # what it does rather than imported: planner_process imports this module
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
        import logging

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

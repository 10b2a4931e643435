"""Predicted vs measured per-rank time: what ``skrull profile --check`` reports (numpy only).

A check compares like with like: it measures the quantity the profile's coefficients were fitted on, and
prices exactly that. Two kinds of profile, two measures (``check_measure``):

``layers`` (a profile from ``skrull profile`` or derived): its compute was fitted on one decoder layer's
kernels ``x num_layers`` plus the head, each pack timed alone, so that is what is measured per GPU part,
and the prediction is the specification's compute part of a GPU's work in one iteration (eqs. 3-4 of
Skrull): for every microbatch it takes part in, ``T_comp(sum of FLOPs of its local sequences) +
T_comp(sum of FLOPs of the sharded sequences / N)`` (``rank_compute_ms``).

``microbatches`` (a profile with a ``calibrated`` block, worker/calibration.py): its coefficients were
fitted on whole training microbatches, forward and backward, timed from the first launch to the last
kernel, so its ``microbatch_ms`` is the per-microbatch cost of a whole model's step (host time launching
every layer's operators, which an eager or host-bound step does not hide) and its token terms the whole
model's. Pricing compute alone against one layer's kernels would leave that constant out on one side and
keep it on the other (an H100 check of a calibrated 0.5B profile read 71%). So each GPU part is run as one
microbatch of the model (the layer ``num_layers`` times in sequence, then the head and its loss, one
backward) and priced ``microbatch_ms + T_comp(local) + T_comp(sharded / N)`` per microbatch
(``rank_microbatch_ms``): the fitted model with communication left out.

In both, communication is left out: the check runs each rank's part on one GPU, in turn, with no
collective.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from skrull.solver.cost import CostModel
from skrull.solver.types import Plan
from skrull.worker.profiling.fit import r_squared


def rank_compute_ms(plan: Plan, lengths: Sequence[int], model: CostModel, *, iteration: int) -> list[float]:
    """Predicted compute milliseconds of every GPU in ``iteration`` (index = global rank)."""
    out = [0.0] * plan.parallel.num_gpus
    for mb in plan.iterations[iteration].microbatches:
        sharded = sum(model.flops(lengths[i]) for i in mb.sharded) / len(mb.ranks)
        for rank, ids in zip(mb.ranks, mb.local, strict=True):
            out[rank] += model.t_comp_ms(sum(model.flops(lengths[i]) for i in ids)) + model.t_comp_ms(sharded)
    return out


def rank_microbatch_ms(plan: Plan, lengths: Sequence[int], model: CostModel, *, iteration: int) -> list[float]:
    """Predicted milliseconds of every GPU's microbatches in ``iteration``, communication left out: per
    microbatch it takes part in (and holds tokens of), ``microbatch_ms + T_comp(local) + T_comp(sharded / N)``."""
    out = [0.0] * plan.parallel.num_gpus
    overhead = model.coefficients.microbatch_ms
    for mb in plan.iterations[iteration].microbatches:
        sharded = sum(model.flops(lengths[i]) for i in mb.sharded) / len(mb.ranks)
        for rank, ids in zip(mb.ranks, mb.local, strict=True):
            if not ids and not mb.sharded:
                continue  # an empty part is not run (measured 0 ms)
            local = model.t_comp_ms(sum(model.flops(lengths[i]) for i in ids))
            out[rank] += overhead + local + model.t_comp_ms(sharded)
    return out


#: What a check measures per GPU part (module doc); ``auto`` picks by the profile's provenance.
MEASURES = ("layers", "microbatches")


def check_measure(doc: Any, requested: str = "auto") -> str:
    """The measure a check of profile document ``doc`` uses: ``requested``, or with ``auto``
    ``microbatches`` for a calibrated profile (a ``calibrated`` block) and ``layers`` for any other."""
    if requested in MEASURES:
        return requested
    if requested != "auto":
        raise ValueError(f"measure must be auto or one of {', '.join(MEASURES)}, got {requested!r}")
    return "microbatches" if isinstance(doc, Mapping) and isinstance(doc.get("calibrated"), Mapping) else "layers"


def rank_predicted_ms(
    plan: Plan, lengths: Sequence[int], model: CostModel, *, iteration: int, measure: str
) -> list[float]:
    """The prediction that matches ``measure``: ``rank_compute_ms`` or ``rank_microbatch_ms``."""
    if measure == "microbatches":
        return rank_microbatch_ms(plan, lengths, model, iteration=iteration)
    return rank_compute_ms(plan, lengths, model, iteration=iteration)


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckStats:
    """Agreement of predictions with measurements over ``n`` (rank, iteration) points."""

    n: int
    median_abs_error_ms: float
    median_abs_rel_error: float
    max_abs_rel_error: float
    r2: float


def check_stats(predicted: Sequence[float], measured: Sequence[float]) -> CheckStats:
    """Median absolute error (ms and relative to the measurement), worst relative error, R^2.

    Points measured at 0 ms (ranks with no work) count in R^2 but not in the relative errors.
    """
    p = np.asarray(predicted, dtype=np.float64)
    y = np.asarray(measured, dtype=np.float64)
    if p.shape != y.shape or p.size == 0:
        raise ValueError(f"need as many predictions as measurements (> 0), got {p.size} and {y.size}")
    abs_err = np.abs(p - y)
    busy = y > 0
    rel = abs_err[busy] / y[busy] if busy.any() else np.zeros(1)
    return CheckStats(
        n=int(p.size),
        median_abs_error_ms=float(np.median(abs_err)),
        median_abs_rel_error=float(np.median(rel)),
        max_abs_rel_error=float(rel.max()),
        r2=r_squared(p, y),
    )


def check_what(
    *,
    datasets: Sequence[str],
    solvers: Sequence[str],
    dp: int,
    cp: int,
    sequences_per_rank: int,
    measure: str = "layers",
) -> str:
    """What a check measured, in words (the ``what`` of ``check_block``)."""
    what = "compute" if measure == "layers" else "whole microbatches (microbatch_ms included, no communication)"
    return (
        f"skrull profile --check: every rank's {what} of the first iteration of {' and '.join(solvers)} plans "
        f"({', '.join(datasets)}; DP{dp} x CP{cp}, {sequences_per_rank} sequences per rank), predicted vs measured"
    )


def check_block(*, median_abs_rel_error: float, limit: float, what: str, report: str | None = None) -> dict[str, Any]:
    """A profile's ``check`` block, the one writer (``skrull profile --check --record``); ``read_check`` reads it."""
    block: dict[str, Any] = {
        "median_abs_rel_error": median_abs_rel_error,
        "limit": limit,
        "passed": median_abs_rel_error <= limit,
        "what": what,
    }
    if report is not None:
        block["report"] = report
    return block


def read_check(doc: Mapping[str, Any]) -> tuple[float, bool] | None:
    """``(median relative error, passed)`` of a profile document's ``check`` block; None when it has no
    readable one (a hand-written profile, or a block with a non-finite error)."""
    block = doc.get("check")
    if not isinstance(block, Mapping):
        return None
    error, limit = _finite(block.get("median_abs_rel_error")), _finite(block.get("limit"))
    if error is None or limit is None:
        return None
    return error, error <= limit


def _finite(value: Any) -> float | None:
    """``value`` as a finite float, or None (booleans, strings, NaN, infinities, integers past float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None

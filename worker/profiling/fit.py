"""Fitting the cost model's coefficients to measurements (numpy only; no torch, no GPU).

What ``skrull profile`` measures and how each contract coefficient follows (docs/formats.md "Profile";
Skrull appendix C):

- compute (eq. 14, ``T_comp = ms_per_tflop * FLOPs / 1e12 + fixed_ms``): least squares of relative
  residuals of measured forward+backward milliseconds over packs of sequences, with the token term and
  the squared-length term fitted apart (``fit_compute_terms``: ``ms = a * sum(S) + b * sum(S^2) + c``).
  Eq. 13 gives both terms one FLOP rate, but on a GPU they are different kernels (GEMMs vs causal
  flash attention, which skips the masked half and runs at its own efficiency), and for gated MLPs
  wider than ``8h/3`` (Qwen2.5: ``I = 5.4h``) eq. 13's ``16h^2`` undercounts the token term. The
  profile keeps eq. 13's ``flops_per_token``, takes ``ms_per_tflop = a / flops_per_token`` and states
  the squared term in the same rate (``flops_per_token_sq = b / ms_per_tflop``, an effective count).
  Every coefficient is kept non-negative (a negative fixed cost would make tiny microbatches free);
- communication (eq. 16, ``T_comm = ms_per_mib * MiB + fixed_ms``): the same fit of collective time
  against message size;
- memory (appendix C.1, ``Memory(S) = alpha * S + beta``): least squares of activation bytes against
  tokens; ``bucket_tokens = floor((capacity * (1 - reserve) - static) / alpha)``;
- attention efficiency by query length (WLB-LLM sec. 4.2: kernels pad to 128-row tiles, short queries
  reach a fraction of peak): achieved TFLOP/s per query length and its ratio to the best.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from skrull.solver.errors import SkrullError

MIB = float(2**20)
TILE_ROWS = 128


class FitError(SkrullError):
    """Too few or degenerate measurements to fit a coefficient."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LinearFit:
    """``y = slope * x + intercept`` with its coefficient of determination over ``n`` points."""

    slope: float
    intercept: float
    r2: float
    n: int

    def predict(self, x: float) -> float:
        return self.slope * x + self.intercept


def r_squared(predicted: Sequence[float] | np.ndarray, measured: Sequence[float] | np.ndarray) -> float:
    """``1 - SS_res / SS_tot``; 1.0 when the measurements are all equal and predicted exactly."""
    y = np.asarray(measured, dtype=np.float64)
    p = np.asarray(predicted, dtype=np.float64)
    ss_res = float(((y - p) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    if ss_tot == 0.0:
        return 1.0 if ss_res == 0.0 else 0.0
    return 1.0 - ss_res / ss_tot


def fit_line(
    x: Sequence[float],
    y: Sequence[float],
    *,
    what: str,
    nonnegative_intercept: bool = True,
    relative: bool = False,
) -> LinearFit:
    """Least squares ``y = slope * x + intercept``.

    ``relative`` minimizes relative residuals ``sum(((y - fit) / y)^2)`` (weights ``1/y``): timings
    span orders of magnitude, and an absolute fit would let the largest samples decide everything,
    leaving the fixed cost (which only the small ones show) to noise. With ``nonnegative_intercept`` a
    negative intercept is refit through 0 with the same weights.
    """
    xs = np.asarray(x, dtype=np.float64)
    ys = np.asarray(y, dtype=np.float64)
    if xs.shape != ys.shape or xs.size < 2:
        raise FitError(f"{what}: need at least 2 measurements, got {xs.size}")
    if not (np.all(np.isfinite(xs)) and np.all(np.isfinite(ys))):
        raise FitError(f"{what}: measurements must be finite")
    if np.ptp(xs) == 0.0:
        raise FitError(f"{what}: measurements must span more than one size")
    if relative and np.any(ys <= 0):
        raise FitError(f"{what}: a relative fit needs positive measurements")
    w = 1.0 / ys if relative else np.ones_like(ys)
    slope, intercept = np.polyfit(xs, ys, 1, w=w)
    if nonnegative_intercept and intercept < 0.0:
        slope, intercept = float((w * w * xs) @ ys / ((w * w * xs) @ xs)), 0.0
    fit_pred = slope * xs + intercept
    return LinearFit(slope=float(slope), intercept=float(intercept), r2=r_squared(fit_pred, ys), n=int(xs.size))


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeSample:
    """One timed forward+backward: the sequence lengths packed, their model FLOPs, the milliseconds."""

    lengths: tuple[int, ...]
    flops: float
    ms: float


def fit_compute(samples: Sequence[ComputeSample]) -> tuple[float, float, float]:
    """``(ms_per_tflop, fixed_ms, r2)`` of ``ms = ms_per_tflop * flops / 1e12 + fixed_ms``."""
    line = fit_line([s.flops / 1e12 for s in samples], [s.ms for s in samples], what="compute", relative=True)
    if line.slope <= 0:
        raise FitError(f"compute: time does not grow with FLOPs (slope {line.slope:.3g} ms per TFLOP)")
    return line.slope, line.intercept, line.r2


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeTerms:
    """``ms = ms_per_token * sum(S) + ms_per_token_sq * sum(S^2) + fixed_ms`` fitted over timed packs."""

    ms_per_token: float
    ms_per_token_sq: float
    fixed_ms: float
    r2: float
    median_abs_rel_error: float
    n: int

    def predict(self, lengths: Sequence[int]) -> float:
        return self.ms_per_token * sum(lengths) + self.ms_per_token_sq * sum(s * s for s in lengths) + self.fixed_ms


def fit_nonnegative(
    columns: np.ndarray, ms: np.ndarray, *, what: str, weights: np.ndarray | None = None
) -> tuple[np.ndarray, float]:
    """Relative least squares of ``ms`` on ``columns`` (one row per measurement) with every coefficient >= 0:
    ``(coefficients, weighted residual)``.

    The non-negative solution is the best of the plain least-squares fits over the column subsets that
    keep the first column (the work term every timing grows with): no iterative solver, at most
    ``2^(k-1)`` small solves for ``k`` columns. Weights ``1/ms``: timings span orders of magnitude;
    ``weights`` multiply them (iteratively reweighted fits: worker/calibration.py).
    """
    ys = np.asarray(ms, dtype=np.float64)
    cols = np.asarray(columns, dtype=np.float64)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        w = 1.0 / ys if weights is None else np.asarray(weights, dtype=np.float64) / ys
    if not (np.all(np.isfinite(w)) and np.all(np.isfinite(cols)) and np.all(np.isfinite(ys))):
        raise FitError(f"{what}: a timing, weight or column is not a finite number (a timing of 0 or a denormal?)")
    k = cols.shape[1]
    best: tuple[float, np.ndarray] | None = None
    for mask in range(1 << (k - 1)):
        keep = [0, *(j + 1 for j in range(k - 1) if mask >> j & 1)]
        a = cols[:, keep] * w[:, None]
        try:
            coef, *_ = np.linalg.lstsq(a, ys * w, rcond=None)
        except np.linalg.LinAlgError as exc:  # non-finite weights or columns: no fit, said as one
            raise FitError(f"{what}: the least squares did not converge ({exc})") from exc
        if np.any(coef < 0.0):
            continue
        full = np.zeros(k)
        full[keep] = coef
        r = ((cols @ full) - ys) * w
        residual = float(r @ r)
        if best is None or residual < best[0]:
            best = (residual, full)
    if best is None or best[1][0] <= 0.0:
        raise FitError(f"{what}: time does not grow with tokens")
    return best[1], best[0]


def fit_compute_terms(samples: Sequence[ComputeSample]) -> ComputeTerms:
    """Relative least squares of ``ms`` on ``[sum(S), sum(S^2), 1]`` with every coefficient >= 0
    (``fit_nonnegative``)."""
    if len(samples) < 3:
        raise FitError(f"compute: need at least 3 measurements, got {len(samples)}")
    ys = np.asarray([s.ms for s in samples], dtype=np.float64)
    if not np.all(np.isfinite(ys)) or np.any(ys <= 0):
        raise FitError("compute: measurements must be finite and positive")
    cols = np.asarray(
        [[float(sum(s.lengths)), float(sum(x * x for x in s.lengths)), 1.0] for s in samples], dtype=np.float64
    )
    if np.ptp(cols[:, 0]) == 0.0:
        raise FitError("compute: measurements must span more than one size")
    coef, _ = fit_nonnegative(cols, ys, what="compute")
    predicted = cols @ coef
    return ComputeTerms(
        ms_per_token=float(coef[0]),
        ms_per_token_sq=float(coef[1]),
        fixed_ms=float(coef[2]),
        r2=r_squared(predicted, ys),
        median_abs_rel_error=float(np.median(np.abs(predicted - ys) / ys)),
        n=len(samples),
    )


#: ``CommSample.collective``: all-gather CP's collective, and Ulysses's.
ALL_GATHER = "all_gather"
ALL_TO_ALL = "all_to_all"


@dataclass(frozen=True, slots=True, kw_only=True)
class CommSample:
    """One timed collective: its bytes (gathered bytes for an all-gather, bytes each member sends for an
    all-to-all), milliseconds, group size, and which collective."""

    num_bytes: float
    ms: float
    group_size: int
    collective: str = "all_gather"


def fit_comm(samples: Sequence[CommSample]) -> tuple[float, float, float]:
    """``(ms_per_mib, fixed_ms, r2)`` of ``ms = ms_per_mib * MiB + fixed_ms``."""
    line = fit_line([s.num_bytes / MIB for s in samples], [s.ms for s in samples], what="comm", relative=True)
    return max(line.slope, 0.0), line.intercept, line.r2


@dataclass(frozen=True, slots=True, kw_only=True)
class MemorySample:
    """Bytes held for backward (and the allocator's peak, when known) for ``tokens`` tokens."""

    tokens: int
    saved_bytes: float
    peak_bytes: float | None = None


def fit_activation_bytes(samples: Sequence[MemorySample]) -> tuple[float, float, float]:
    """``(alpha bytes per token, beta bytes, r2)`` of activation memory (Skrull appendix C.1)."""
    line = fit_line([s.tokens for s in samples], [s.saved_bytes for s in samples], what="memory")
    if line.slope <= 0:
        raise FitError(f"memory: activation bytes do not grow with tokens (slope {line.slope:.3g})")
    return line.slope, line.intercept, line.r2


def bucket_tokens(
    *, capacity_bytes: float, reserve_fraction: float, static_bytes: float, activation_bytes_per_token: float
) -> int:
    """Tokens one GPU holds: ``floor((capacity * (1 - reserve) - static) / alpha)`` (0 if nothing fits)."""
    free = capacity_bytes * (1.0 - reserve_fraction) - static_bytes
    if free <= 0 or activation_bytes_per_token <= 0:
        return 0
    return math.floor(free / activation_bytes_per_token)


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionPoint:
    """Attention forward+backward over one causal sequence of ``query_tokens`` tokens."""

    query_tokens: int
    ms: float
    flops: float

    @property
    def tflops(self) -> float:
        return self.flops / (self.ms * 1e-3) / 1e12 if self.ms > 0 else 0.0

    @property
    def tile_padding(self) -> float:
        """Rows computed per useful row when queries are padded to 128-row tiles."""
        return math.ceil(self.query_tokens / TILE_ROWS) * TILE_ROWS / self.query_tokens


def attention_efficiency(points: Sequence[AttentionPoint]) -> list[dict[str, float]]:
    """Per query length: ms, achieved TFLOP/s, efficiency (vs the best length) and tile padding."""
    if not points:
        return []
    best = max(p.tflops for p in points)
    return [
        {
            "query_tokens": p.query_tokens,
            "ms": round(p.ms, 6),
            "tflops": round(p.tflops, 4),
            "efficiency": round(p.tflops / best, 4) if best > 0 else 0.0,
            "tile_padding": round(p.tile_padding, 4),
        }
        for p in sorted(points, key=lambda p: p.query_tokens)
    ]

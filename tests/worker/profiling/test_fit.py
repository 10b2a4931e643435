"""The profiler's fitting logic on synthetic timings with known coefficients (no torch, no GPU)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skrull.solver.profile import profile_from_dict
from skrull.solver.profiles.derive import MODELS, TrainingSetup, flops_coefficients
from skrull.worker.profiling.fit import (
    AttentionPoint,
    CommSample,
    ComputeSample,
    FitError,
    MemorySample,
    attention_efficiency,
    bucket_tokens,
    fit_activation_bytes,
    fit_comm,
    fit_compute,
    fit_compute_terms,
    fit_line,
    fit_nonnegative,
    r_squared,
)

QWEN = MODELS["qwen2.5-0.5b"]


def synthetic_compute(ms_per_tflop: float, fixed_ms: float, *, noise: float, seed: int = 0) -> list[ComputeSample]:
    """Timings of the profiler's packs from known coefficients, with relative Gaussian noise."""
    rng = np.random.default_rng(seed)
    fpt, fpt_sq = flops_coefficients(QWEN)
    samples = []
    for s in (128, 256, 512, 1024, 2048, 4096, 8192, 16384):
        for count in (1, 4, 16):
            if s // count < 64:
                continue
            lengths = (s // count,) * count
            flops = sum(fpt * n + fpt_sq * n * n for n in lengths)
            ms = (ms_per_tflop * flops / 1e12 + fixed_ms) * (1 + noise * rng.standard_normal())
            samples.append(ComputeSample(lengths=lengths, flops=flops, ms=ms))
    return samples


@settings(max_examples=50, deadline=None)
@given(st.floats(0.5, 20.0), st.floats(0.0, 5.0), st.integers(0, 1000))
def test_compute_fit_recovers_known_coefficients_under_noise(ms_per_tflop: float, fixed_ms: float, seed: int) -> None:
    slope, intercept, r2 = fit_compute(synthetic_compute(ms_per_tflop, fixed_ms, noise=0.01, seed=seed))
    assert slope == pytest.approx(ms_per_tflop, rel=0.03)
    assert intercept >= 0.0
    assert abs(intercept - fixed_ms) <= 0.05 * fixed_ms + 0.1  # 1% noise on ~10-300 ms packs
    assert r2 > 0.99


def test_exact_timings_fit_exactly() -> None:
    slope, intercept, r2 = fit_compute(synthetic_compute(3.37, 1.5, noise=0.0))
    assert slope == pytest.approx(3.37, rel=1e-9) and intercept == pytest.approx(1.5, rel=1e-6) and r2 == 1.0


def test_negative_intercept_is_refit_through_zero() -> None:
    fit = fit_line([1.0, 2.0, 3.0], [0.5, 1.6, 2.7], what="compute")  # OLS intercept is -0.6
    assert fit.intercept == 0.0
    assert fit.slope == pytest.approx((0.5 + 3.2 + 8.1) / 14)
    rel = fit_line([1.0, 2.0, 3.0], [0.5, 1.6, 2.7], what="compute", relative=True)
    x_over_y = (1 / 0.5, 2 / 1.6, 3 / 2.7)  # minimizing sum((y - s x) / y)^2 gives s = sum(x/y) / sum((x/y)^2)
    assert rel.intercept == 0.0 and rel.slope == pytest.approx(sum(x_over_y) / sum(r * r for r in x_over_y))
    raw = fit_line([1.0, 2.0, 3.0], [0.5, 1.6, 2.7], what="compute", nonnegative_intercept=False)
    assert raw.intercept == pytest.approx(-0.6)


@pytest.mark.parametrize(
    ("x", "y", "message"),
    [
        ([1.0], [2.0], "at least 2"),
        ([3.0, 3.0, 3.0], [1.0, 2.0, 3.0], "more than one size"),
        ([1.0, float("nan")], [1.0, 2.0], "finite"),
    ],
)
def test_degenerate_measurements_are_refused(x: list[float], y: list[float], message: str) -> None:
    with pytest.raises(FitError, match=message):
        fit_line(x, y, what="compute")


def test_relative_fit_needs_positive_timings() -> None:
    with pytest.raises(FitError, match="positive"):
        fit_line([1.0, 2.0], [0.0, 1.0], what="compute", relative=True)


def test_compute_that_does_not_grow_is_refused() -> None:
    flat = [ComputeSample(lengths=(n,), flops=n * 1e9, ms=5.0 - n * 1e-3) for n in (100, 200, 400)]
    with pytest.raises(FitError, match="does not grow"):
        fit_compute(flat)


def test_comm_fit_per_mib_and_fixed_cost() -> None:
    # a fixed 0.035 ms per collective plus 360 GB/s bus bandwidth
    ms_per_mib = 2**20 / 360e9 * 1e3
    samples = [
        CommSample(num_bytes=float(b), ms=0.035 + ms_per_mib * b / 2**20, group_size=8) for b in (2**20, 2**24, 2**28)
    ]
    slope, intercept, r2 = fit_comm(samples)
    assert slope == pytest.approx(ms_per_mib, rel=1e-9) and intercept == pytest.approx(0.035, rel=1e-6) and r2 == 1.0


def test_activation_fit_and_bucket_follow_skrull_appendix_c1() -> None:
    alpha, beta = 88_000.0, 3.0e6
    samples = [MemorySample(tokens=t, saved_bytes=alpha * t + beta) for t in (4096, 8192, 12288, 16384)]
    got_alpha, got_beta, r2 = fit_activation_bytes(samples)
    assert got_alpha == pytest.approx(alpha) and got_beta == pytest.approx(beta, rel=1e-6) and r2 == 1.0
    # (80 GiB * 0.9 - 2.7 GB static) / 2.1 MB per token
    bucket = bucket_tokens(
        capacity_bytes=80 * 2**30, reserve_fraction=0.1, static_bytes=2.717e9, activation_bytes_per_token=2.11584e6
    )
    assert bucket == math.floor((80 * 2**30 * 0.9 - 2.717e9) / 2.11584e6) == 35254
    assert (
        bucket_tokens(capacity_bytes=1e9, reserve_fraction=0.1, static_bytes=2e9, activation_bytes_per_token=1.0) == 0
    )


def test_attention_efficiency_is_relative_to_the_best_length_with_tile_padding() -> None:
    points = [
        AttentionPoint(query_tokens=100, ms=1.0, flops=1e9),  # 1 TFLOP/s, padded to 128 rows
        AttentionPoint(query_tokens=4096, ms=1.0, flops=4e11),  # 400 TFLOP/s
        AttentionPoint(query_tokens=1024, ms=1.0, flops=2e11),
    ]
    table = attention_efficiency(points)
    assert [row["query_tokens"] for row in table] == [100, 1024, 4096]
    assert table[2]["efficiency"] == 1.0 and table[1]["efficiency"] == 0.5
    assert table[0]["tile_padding"] == 1.28 and table[2]["tile_padding"] == 1.0
    assert table[2]["tflops"] == pytest.approx(400.0)


def test_r_squared_of_perfect_and_mean_predictions() -> None:
    assert r_squared([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == 1.0
    assert r_squared([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]) == 0.0


def test_profile_document_is_a_contract_profile_with_the_fitted_coefficients() -> None:
    from skrull.worker.profiling.document import model_from_doc, profile_document

    compute = synthetic_compute(4.0, 2.0, noise=0.0)
    memory = [MemorySample(tokens=t, saved_bytes=50_000.0 * t) for t in (1024, 2048, 4096)]
    comm = [CommSample(num_bytes=float(b), ms=0.02 + 0.003 * b / 2**20, group_size=2) for b in (2**20, 2**24)]
    setup = TrainingSetup()
    common = {
        "name": "test-gpu/qwen2.5-0.5b",
        "model": QWEN,
        "measured": {"device": "Test GPU", "date": "2026-01-01T00:00:00+00:00"},
        "compute_samples": compute,
        "attention_points": [AttentionPoint(query_tokens=128, ms=0.1, flops=1e9)],
        "memory_samples": memory,
        "capacity_bytes": 80 * 2**30,
        "setup": setup,
        "bytes_per_value": 2,
        "derived_comm": {"ms_per_mib": 0.0029, "fixed_ms": 1.68},
        "derived_microbatch_ms": 7.94,
    }
    doc = profile_document(**common, comm_samples=comm)  # type: ignore[arg-type]
    profile = profile_from_dict(doc)
    assert profile.compute.ms_per_tflop == pytest.approx(4.0) and profile.compute.fixed_ms == pytest.approx(2.0)
    assert profile.comm.ms_per_mib == pytest.approx(0.003) and profile.comm.fixed_ms == pytest.approx(0.02 * 48)
    assert profile.comm.bytes_per_token == 24576.0  # 24 layers * K,V * 128 * 2 bytes * fwd+bwd
    alpha = 24 * 50_000.0 + 6 * QWEN.vocab_size
    assert doc["memory"]["activation_bytes_per_token"] == pytest.approx(alpha)
    assert profile.bucket_tokens == bucket_tokens(
        capacity_bytes=80 * 2**30,
        reserve_fraction=0.1,
        static_bytes=doc["memory"]["static_bytes"],
        activation_bytes_per_token=alpha,
    )
    assert doc["estimated"] is False and doc["measured"]["device"] == "Test GPU"
    assert len(doc["compute"]["samples"]) == len(compute) and doc["comm"]["measured"] is True
    assert model_from_doc(doc["model"]) == QWEN

    one_gpu = profile_document(**common, comm_samples=[])  # type: ignore[arg-type]
    assert one_gpu["comm"]["measured"] is False and one_gpu["comm"]["ms_per_mib"] == 0.0029
    assert "comm_a2a" not in doc and "comm_a2a" not in one_gpu  # nothing timed, nothing derived given

    # timed all-to-alls give Ulysses's section: its own fit, the derived bytes, the model's heads
    a2a = [
        CommSample(num_bytes=float(b), ms=0.01 + 0.002 * b / 2**20, group_size=2, collective="all_to_all")
        for b in (2**20, 2**24)
    ]
    ulysses = profile_from_dict(profile_document(**common, comm_samples=[*comm, *a2a]))  # type: ignore[arg-type]
    assert ulysses.comm.ms_per_mib == pytest.approx(0.003)  # the all-gathers alone fit comm
    assert ulysses.heads is not None and (ulysses.heads.attention, ulysses.heads.kv) == (14, 2)
    assert ulysses.comm_a2a is not None
    assert ulysses.comm_a2a.ms_per_mib == pytest.approx(0.002) and ulysses.comm_a2a.fixed_ms == pytest.approx(
        0.01 * 4 * 24
    )
    # 24 layers * (2 * 896 + 2 * 128) values * 2 bytes * fwd+bwd, of which K and V: 24 * 2 * 128 * 2 * 2
    assert (ulysses.comm_a2a.bytes_per_token, ulysses.comm_a2a.kv_bytes_per_token) == (196608.0, 24576.0)
    derived = profile_document(  # type: ignore[arg-type]
        **common, comm_samples=[], derived_a2a={"ms_per_mib": 0.0029, "fixed_ms": 3.36}
    )
    assert derived["comm_a2a"]["measured"] is False and derived["comm_a2a"]["fixed_ms"] == 3.36
    assert profile_from_dict(derived).plans_ulysses

    # on a GPU the allocator's peak grows faster than the saved bytes: the bucket follows the peak
    common["memory_samples"] = [
        MemorySample(tokens=t, saved_bytes=50_000.0 * t, peak_bytes=70_000.0 * t + 1e6) for t in (1024, 2048, 4096)
    ]
    peaked = profile_document(**common, comm_samples=[])  # type: ignore[arg-type]
    assert peaked["memory"]["activation_bytes_per_token"] == pytest.approx(24 * 70_000.0 + 6 * QWEN.vocab_size)
    assert peaked["memory"]["bucket_tokens"] < doc["memory"]["bucket_tokens"]


def two_term_samples(a: float, b: float, c: float, *, noise: float, seed: int = 0) -> list[ComputeSample]:
    """The profiler's packs timed as ``a * sum(S) + b * sum(S^2) + c`` (ms), with relative noise."""
    rng = np.random.default_rng(seed)
    out = []
    for s in (128, 256, 512, 1024, 2048, 4096, 8192, 16384):
        for count in (1, 4, 16):
            if s // count < 64:
                continue
            lengths = (s // count,) * count
            ms = (a * sum(lengths) + b * sum(n * n for n in lengths) + c) * (1 + noise * rng.standard_normal())
            out.append(ComputeSample(lengths=lengths, flops=0.0, ms=ms))
    return out


@settings(max_examples=50, deadline=None)
@given(st.floats(1e-4, 1e-2), st.floats(1e-9, 1e-6), st.floats(0.0, 200.0), st.integers(0, 1000))
def test_two_term_fit_predicts_every_pack_under_noise(a: float, b: float, c: float, seed: int) -> None:
    # 1% noise: a squared term far below the token term is not identifiable, but every prediction holds
    terms = fit_compute_terms(two_term_samples(a, b, c, noise=0.01, seed=seed))
    for exact in two_term_samples(a, b, c, noise=0.0):
        assert terms.predict(exact.lengths) == pytest.approx(exact.ms, rel=0.03)
    assert min(terms.ms_per_token, terms.ms_per_token_sq, terms.fixed_ms) >= 0.0
    assert terms.median_abs_rel_error < 0.03


@pytest.mark.parametrize(("a", "b", "c"), [(2e-3, 5e-8, 4.0), (1e-2, 1e-6, 0.0), (3e-4, 0.0, 120.0)])
def test_two_term_fit_of_exact_timings_recovers_each_term(a: float, b: float, c: float) -> None:
    terms = fit_compute_terms(two_term_samples(a, b, c, noise=0.0))
    assert terms.ms_per_token == pytest.approx(a, rel=1e-6)
    assert terms.ms_per_token_sq == pytest.approx(b, rel=1e-6, abs=1e-15)
    assert terms.fixed_ms == pytest.approx(c, rel=1e-6, abs=1e-9) and terms.r2 == pytest.approx(1.0)


def test_two_term_fit_keeps_every_coefficient_non_negative() -> None:
    # long sequences cheaper than short ones per token (a host-bound floor): no negative squared term
    samples = [ComputeSample(lengths=(s,), flops=0.0, ms=100.0 + 0.001 * s) for s in (128, 1024, 8192)]
    samples.append(ComputeSample(lengths=(512,) * 16, flops=0.0, ms=100.0 + 0.001 * 8192 * 1.5))
    terms = fit_compute_terms(samples)
    assert terms.ms_per_token > 0 and terms.ms_per_token_sq >= 0 and terms.fixed_ms >= 0


def test_flat_or_too_few_timings_are_refused() -> None:
    with pytest.raises(FitError, match="at least 3"):
        fit_compute_terms(two_term_samples(1e-3, 1e-7, 1.0, noise=0.0)[:2])
    with pytest.raises(FitError, match="finite and positive"):
        fit_compute_terms([ComputeSample(lengths=(n,), flops=0.0, ms=-1.0) for n in (128, 256, 512)])


def test_measured_profile_estimates_equal_the_fit() -> None:
    """Attention at its own rate (half of eq. 13's squared FLOPs at the token rate): the profile's
    contract coefficients reproduce the two-term fit, so the reference model predicts every pack."""
    from skrull.worker.profiling.document import _compute_section

    fpt, fpt_sq = flops_coefficients(QWEN)
    ms_per_tflop = 2.5
    a, b, c = ms_per_tflop * fpt / 1e12, 0.5 * ms_per_tflop * fpt_sq / 1e12, 3.0
    samples = two_term_samples(a, b, c, noise=0.0)
    block = _compute_section(QWEN, samples)
    assert block["flops_per_token"] == fpt and block["flops_per_token_sq_eq13"] == fpt_sq
    assert block["ms_per_tflop"] == pytest.approx(ms_per_tflop, rel=1e-6)
    assert block["flops_per_token_sq"] == pytest.approx(0.5 * fpt_sq, rel=1e-6)
    for s in samples:
        estimate = sum(
            block["ms_per_tflop"] * (block["flops_per_token"] * n + block["flops_per_token_sq"] * n * n) / 1e12
            for n in s.lengths
        )
        assert estimate + block["fixed_ms"] == pytest.approx(s.ms, rel=1e-5)


def test_a_least_squares_that_cannot_converge_is_a_fit_error() -> None:
    """A denormal timing overflows the relative weights (1 / ms), and numpy's least squares then fails to
    converge: one FitError naming the fit instead, which the calibration's refit catches."""
    cols = np.asarray([[100.0, 1e4, 1.0], [200.0, 4e4, 1.0], [300.0, 9e4, 1.0]])
    with pytest.raises(FitError, match="calibration: a timing, weight or column is not a finite number"):
        fit_nonnegative(cols, np.asarray([5e-324, 2.0, 3.0]), what="calibration")

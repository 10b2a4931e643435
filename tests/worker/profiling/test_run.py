"""The whole profile pipeline in process, with timings that follow a known cost model exactly."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from skrull.solver.profile import profile_from_dict
from skrull.solver.profiles.derive import flops_coefficients
from skrull.worker.profiling import measure as measure_module
from skrull.worker.profiling.measure import TINY, sequence_flops
from skrull.worker.profiling.run import ProfileOptions, compute_packs, length_grid, run_profile


def test_length_grid_and_packs_cover_linear_and_quadratic_terms() -> None:
    assert length_grid(1000) == [128, 256, 512, 1000]
    assert length_grid(128) == [128]
    packs = compute_packs([256, 1024])
    assert [256] in packs and [64] * 4 in packs and [64] * 16 in packs and [256] * 4 in packs


def test_profile_recovers_the_cost_model_the_timings_follow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pack costs 0.5 ms + 2 ms per TFLOP: the fitted profile must say exactly that."""

    def modeled_parts(layer: Any, parts: Any, **kw: Any) -> list[float]:
        return [0.5 + 2.0 * sequence_flops(TINY, p.local_lengths) / 1e12 for p in parts]

    monkeypatch.setattr(measure_module, "measure_parts", modeled_parts)
    options = ProfileOptions(
        model=TINY, device=torch.device("cpu"), dtype=torch.float32, max_tokens=256, repeats=1, capacity_bytes=2**33
    )
    doc = run_profile(options)
    profile = profile_from_dict(doc)
    assert profile.compute.ms_per_tflop == pytest.approx(2.0, rel=1e-6)
    assert profile.compute.fixed_ms == pytest.approx(0.5, rel=1e-6)
    assert doc["compute"]["r2"] == pytest.approx(1.0)
    assert doc["measured"]["memory_bytes"] == 2**33 and doc["name"].endswith("/tiny")
    # the bucket follows from the measured activation bytes and the given memory
    memory = doc["memory"]
    free = 2**33 * (1 - memory["reserve_fraction"]) - memory["static_bytes"]
    assert profile.bucket_tokens == int(free // memory["activation_bytes_per_token"])
    # one GPU: no collective to time; Ulysses's section is the derivation's, marked so
    assert doc["comm_a2a"]["measured"] is False and profile.plans_ulysses


def test_profile_over_two_processes_times_both_collectives_for_both_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    from skrull.worker.profiling import run as run_module

    monkeypatch.setattr(
        measure_module, "measure_parts", lambda layer, parts, **kw: [1.0 + len(p.local_lengths) for p in parts]
    )
    monkeypatch.setattr(run_module, "COMM_SIZES", (2**12, 2**14, 2**16))  # small: two gloo processes on CPU
    options = ProfileOptions(
        model=TINY, device=torch.device("cpu"), dtype=torch.float32, max_tokens=256, repeats=1, capacity_bytes=2**33,
        num_gpus=2,
    )  # fmt: skip
    doc = run_profile(options)
    profile = profile_from_dict(doc)
    for section in ("comm", "comm_a2a"):
        assert doc[section]["measured"] is True and doc[section]["group_size"] == 2
        assert len(doc[section]["samples"]) == 3
    assert {s["collective"] for s in doc["comm_a2a"]["samples"]} == {"all_to_all"}
    assert profile.plans_ulysses and profile.heads is not None
    assert (profile.heads.attention, profile.heads.kv) == (TINY.num_heads, TINY.num_kv_heads)


def test_check_measures_a_calibrated_profile_on_whole_microbatches(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device whose whole microbatches cost 30 ms + 2 ms per TFLOP (a host-bound step): the calibrated
    profile saying so checks at 0% on whole microbatches, the measure ``auto`` picks for it; the same
    measurements priced as compute alone (the check before) read the constant as a large error."""
    from skrull.solver.types import Parallel
    from skrull.worker.profiling import run as run_module
    from skrull.worker.profiling.check import check_measure, check_stats, rank_compute_ms
    from skrull.worker.profiling.run import run_check

    def compute_ms(part: Any) -> float:
        assert not part.pieces  # CP1: every sequence whole
        return 2.0 * sequence_flops(TINY, part.local_lengths) / 1e12

    def not_layers(*args: Any, **kw: Any) -> list[float]:
        raise AssertionError("a calibrated profile is not checked on layers timed alone")

    monkeypatch.setattr(run_module, "measure_parts", not_layers)
    monkeypatch.setattr(
        run_module, "measure_microbatches", lambda layer, parts, **kw: [30.0 + compute_ms(p) for p in parts]
    )
    per_token, per_token_sq = flops_coefficients(TINY)
    doc = {
        "name": "tiny+calibrated",
        "estimated": False,
        "compute": {"flops_per_token": per_token, "flops_per_token_sq": per_token_sq, "ms_per_tflop": 2.0,
                    "fixed_ms": 0.0},
        "comm": {"bytes_per_token": 1024, "ms_per_mib": 0.1, "fixed_ms": 0.1},
        "memory": {"bucket_tokens": 512},
        "microbatch_ms": 30.0,
        "calibrated": {"from": "tiny", "microbatches": 12},
    }  # fmt: skip

    def median_error(measure: str, *, compute_only: bool = False) -> float:
        if compute_only:  # what the check priced before: compute alone, against the same measurements
            monkeypatch.setattr(run_module, "rank_predicted_ms", lambda *a, **kw: rank_compute_ms(*a, iteration=0))
        rows = run_check(
            profile_from_dict(doc), TINY, device=torch.device("cpu"), dtype=torch.float32,
            datasets=["llama3-sft-mix"], solvers=["skrull"], parallel=Parallel(dp=2, cp=1), sequences_per_rank=3,
            repeats=1, measure=measure,
        )  # fmt: skip
        return check_stats(
            [p for r in rows for p in r.predicted_ms], [m for r in rows for m in r.measured_ms]
        ).median_abs_rel_error

    assert check_measure(doc) == "microbatches"
    assert median_error("microbatches") == pytest.approx(0.0, abs=1e-9)
    assert median_error("microbatches", compute_only=True) > 0.9
    with pytest.raises(ValueError, match="measure"):
        median_error("auto")

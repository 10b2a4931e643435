"""The whole profile pipeline in process, with timings that follow a known cost model exactly."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from skrull.solver.profile import profile_from_dict
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

"""Bundled GPU specs: the datasheet figures, their sources, and what a derived profile makes of them."""

from __future__ import annotations

import dataclasses

import pytest

from skrull.solver.errors import RequestError
from skrull.solver.profiles.derive import (
    MODELS,
    TrainingSetup,
    activation_bytes_per_token,
    calibrated_bucket_tokens,
    derive_profile,
)
from skrull.solver.profiles.gpus import ACHIEVED_LINK_FRACTION, GPUS, get_gpu, gpu_from_figures

#: Datasheet figures (memory GB, dense BF16 TFLOP/s, link GB/s) and words their source must quote.
DATASHEETS = {
    "h100-80g": (80, 989.0, 900.0, ("H100", "989", "900 GB/s")),
    "h200-141g": (141, 989.0, 900.0, ("H200", "141 GB", "989", "900 GB/s")),
    "a100-80g": (80, 312.0, 600.0, ("A100", "80 GB", "312", "600 GB/s")),
    "l40s-48g": (48, 362.05, 64.0, ("L40S", "48 GB", "362.05", "PCIe", "64 GB/s")),
    "b200-180g": (180, 2250.0, 1800.0, ("B200", "180 GB", "2.25", "1.8 TB/s")),
}


def test_the_bundled_gpus_are_the_documented_ones() -> None:
    assert set(GPUS) == set(DATASHEETS)


@pytest.mark.parametrize("name", sorted(DATASHEETS))
def test_spec_holds_the_datasheet_figures_and_quotes_them(name: str) -> None:
    memory_gb, tflops, link_gbs, quoted = DATASHEETS[name]
    gpu = GPUS[name]
    assert gpu.name == name
    assert gpu.memory_bytes == memory_gb * 2**30
    assert gpu.peak_bf16_tflops == tflops
    assert gpu.cp_bus_bandwidth_gbs == pytest.approx(ACHIEVED_LINK_FRACTION * link_gbs)
    assert gpu.dp_bandwidth_gbs > 0
    for words in quoted:
        assert words in gpu.source, (name, words)
    assert "assumed" in gpu.source


@pytest.mark.parametrize("name", sorted(DATASHEETS))
def test_profile_on_each_gpu_follows_its_figures(name: str) -> None:
    gpu = GPUS[name]
    profile = derive_profile(MODELS["qwen2.5-7b"], gpu, paper_bucket=True)
    assert profile.name == f"{name}/qwen2.5-7b"
    assert profile.compute.ms_per_tflop == pytest.approx(1e3 / (gpu.peak_bf16_tflops * 0.30), rel=1e-6)
    assert profile.comm.ms_per_mib == pytest.approx(2**20 / (gpu.cp_bus_bandwidth_gbs * 1e9) * 1e3, abs=1e-8)
    memory = profile.extra["memory"]
    assert profile.bucket_tokens == calibrated_bucket_tokens(MODELS["qwen2.5-7b"], gpu, TrainingSetup(), 13_000)
    formula = activation_bytes_per_token(MODELS["qwen2.5-7b"])  # the derivation's bytes, not the paper bucket's
    expected = int((gpu.memory_bytes * 0.9 - memory["static_bytes"]) // formula)
    assert memory["derived_bucket_tokens"] == max(expected, 0)
    assert profile.extra["gpu"] == {"name": name, "memory_bytes": gpu.memory_bytes, "source": gpu.source}


def test_more_memory_gives_a_bigger_bucket_and_faster_links_cheaper_communication() -> None:
    profiles = {n: derive_profile(MODELS["qwen2.5-7b"], g) for n, g in GPUS.items()}
    buckets = {n: p.extra["memory"]["derived_bucket_tokens"] for n, p in profiles.items()}
    assert buckets["l40s-48g"] < buckets["a100-80g"] == buckets["h100-80g"]
    assert buckets["h100-80g"] < buckets["h200-141g"] < buckets["b200-180g"]
    assert profiles["b200-180g"].comm.ms_per_mib < profiles["h100-80g"].comm.ms_per_mib
    assert profiles["h100-80g"].comm.ms_per_mib < profiles["a100-80g"].comm.ms_per_mib
    assert profiles["a100-80g"].comm.ms_per_mib < profiles["l40s-48g"].comm.ms_per_mib


def test_the_paper_bucket_is_exact_on_its_gpu_and_scaled_by_free_memory_elsewhere() -> None:
    h100 = derive_profile(MODELS["qwen2.5-7b"], GPUS["h100-80g"], paper_bucket=True)
    assert h100.bucket_tokens == 13_000
    h200 = derive_profile(MODELS["qwen2.5-7b"], GPUS["h200-141g"], paper_bucket=True)
    free = {
        p.name: GPUS[p.name.split("/")[0]].memory_bytes * 0.9 - p.extra["memory"]["static_bytes"] for p in (h100, h200)
    }
    assert h200.bucket_tokens == int(13_000 * free[h200.name] / free[h100.name]) > 13_000
    assert h200.extra["memory"]["paper_bucket_tokens"] == 13_000
    # more memory never gives a smaller bucket: 94 GiB against the H100's 80 GB
    roomier = dataclasses.replace(GPUS["h100-80g"], name="h100-94g", memory_bytes=94 * 2**30)
    assert derive_profile(MODELS["qwen2.5-7b"], roomier, paper_bucket=True).bucket_tokens > 13_000


@pytest.mark.parametrize(
    ("field", "value"),
    [("memory_gib", 0), ("peak_bf16_tflops", -1.0), ("link_bandwidth_gbs", float("nan")), ("dp_bandwidth_gbs", 1e300)],
)
def test_figures_must_be_finite_and_positive(field: str, value: float) -> None:
    figures = {"memory_gib": 80, "peak_bf16_tflops": 500.0, "link_bandwidth_gbs": 400.0, "dp_bandwidth_gbs": 25.0}
    with pytest.raises(RequestError) as err:
        gpu_from_figures(name="x", source="test", **{**figures, field: value})
    assert err.value.field == field


def test_unknown_gpu_names_the_known_ones() -> None:
    with pytest.raises(RequestError, match="h200-141g"):
        get_gpu("v100")

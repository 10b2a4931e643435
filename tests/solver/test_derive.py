"""Profile derivation: coefficients from model configs, and the bundled files stay in sync with it."""

from __future__ import annotations

import json

import pytest

from skrull.solver.derive import GPUS, MODELS, PAPER_BUCKET_TOKENS, derive_profile, flops_coefficients
from skrull.solver.profile import bundled_profile_names, load_profile, profile_file_name, profiles_dir


def test_qwen_05b_coefficients_match_the_contract_example() -> None:
    model = MODELS["qwen2.5-0.5b"]
    per_token, per_token_sq = flops_coefficients(model)
    assert per_token == pytest.approx(1.189e9, rel=1e-3)
    assert per_token_sq == 258048
    profile = derive_profile(model, GPUS["h100-80g"])
    assert profile.comm.bytes_per_token == 24576
    assert profile.compute.ms_per_tflop == pytest.approx(3.37, abs=0.01)


@pytest.mark.parametrize(
    ("name", "published_params"),
    [("qwen2.5-0.5b", 0.49e9), ("qwen2.5-7b", 7.61e9), ("llama2-7b", 6.74e9), ("llama2-13b", 13.0e9)],
)
def test_parameter_counts_match_published_sizes(name: str, published_params: float) -> None:
    assert MODELS[name].num_params == pytest.approx(published_params, rel=0.01)


DERIVED = tuple(n for n in bundled_profile_names() if n.startswith("h100-80g/"))
MEASURED = tuple(n for n in bundled_profile_names() if n.startswith("h100-80g-measured/"))


def test_bundled_profiles_are_the_derivation_output_and_the_measured_ones() -> None:
    assert set(DERIVED) == {f"h100-80g/{m}" for m in MODELS}
    assert set(MEASURED) == {"h100-80g-measured/qwen2.5-0.5b", "h100-80g-measured/qwen2.5-7b"}
    assert set(bundled_profile_names()) == {*DERIVED, *MEASURED}
    for name in MODELS:
        derived = derive_profile(MODELS[name], GPUS["h100-80g"]).to_dict()
        path = profiles_dir() / profile_file_name(f"h100-80g/{name}")
        assert json.loads(path.read_text()) == json.loads(json.dumps(derived)), f"run `make profiles` ({name})"


def test_every_derived_profile_is_marked_estimated_with_sources() -> None:
    for name in DERIVED:
        profile = load_profile(name)
        assert profile.extra["estimated"] is True
        for section in ("compute", "comm", "memory", "model", "gpu"):
            assert profile.extra[section]["source"], (name, section)


def test_paper_buckets_are_used_and_derived_ones_recorded() -> None:
    for name, bucket in PAPER_BUCKET_TOKENS.items():
        profile = load_profile(f"h100-80g/{name}")
        assert profile.bucket_tokens == bucket
        assert profile.extra["memory"]["derived_bucket_tokens"] > 0
    llama = load_profile("h100-80g/llama2-7b")
    assert llama.bucket_tokens == llama.extra["memory"]["derived_bucket_tokens"]


@pytest.mark.parametrize("name", MEASURED)
def test_measured_profiles_are_the_fit_of_their_own_samples(name: str) -> None:
    """A bundled measured profile says where it was measured, and its coefficients are exactly what the
    profiler's fit gives on the raw samples it keeps (nothing edited by hand)."""
    from skrull.worker.profiling.document import _compute_section, model_from_doc
    from skrull.worker.profiling.fit import ComputeSample

    profile = load_profile(name)
    doc = profile.extra
    assert doc["estimated"] is False and "H100" in doc["measured"]["device"] and doc["measured"]["torch"]
    assert doc["check"]["passed"] == (doc["check"]["median_abs_rel_error"] <= doc["check"]["limit"])
    raw = doc["compute"]["samples"]
    samples = [ComputeSample(lengths=tuple(s["lengths"]), flops=s["flops"], ms=s["ms"]) for s in raw]
    refit = _compute_section(model_from_doc(doc["model"]), samples)
    assert refit.keys() == doc["compute"].keys()
    for key, value in refit.items():
        if isinstance(value, float):
            assert doc["compute"][key] == pytest.approx(value, rel=1e-5, abs=1e-9), key
        else:
            assert doc["compute"][key] == value, key

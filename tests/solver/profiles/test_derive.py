"""Profile derivation: coefficients from model configs, and the bundled files stay in sync with it."""

from __future__ import annotations

import dataclasses
import json

import pytest

from skrull.solver.errors import RequestError
from skrull.solver.profile import Profile, bundled_profile_names, load_profile, profile_file_name, profiles_dir
from skrull.solver.profiles.derive import (
    GPUS,
    MODELS,
    PAPER_BUCKET_TOKENS,
    SETUPS,
    ModelConfig,
    TrainingSetup,
    activation_bytes_per_token,
    derive_profile,
    flops_coefficients,
    free_memory_bytes,
    kv_heads_per_tp_rank,
    params_per_tp_rank,
)


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
        derived = derive_profile(MODELS[name], GPUS["h100-80g"], paper_bucket=True).to_dict()
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


# Tensor parallelism: one GPU of a TP group of degree t (solver/profiles/derive.py module docstring).

H100 = GPUS["h100-80g"]


def _tp(name: str, tp: int, model: ModelConfig | None = None, *, paper_bucket: bool = False) -> Profile:
    model = model or MODELS[name]
    setup = dataclasses.replace(SETUPS.get(name, TrainingSetup()), tp=tp)
    return derive_profile(model, H100, setup, paper_bucket=paper_bucket)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_tp_1_is_the_plain_profile(name: str) -> None:
    plain = derive_profile(MODELS[name], H100)
    assert _tp(name, 1).to_dict() == plain.to_dict()
    assert "tensor_parallel" not in plain.extra and "tp" not in plain.extra["setup"]


def test_tp_2_charges_each_gpu_half_of_every_split_term() -> None:
    """Llama2-7B (32 heads, 32 K/V heads: nothing replicated) at t = 2, every core value from the formulas."""
    model, plain, tp2 = MODELS["llama2-7b"], derive_profile(MODELS["llama2-7b"], H100), _tp("llama2-7b", 2)
    h, layers = model.hidden_size, model.num_layers
    norms = 2 * h * layers + h  # RMSNorm weights stay whole on every rank
    params = (model.num_params - norms) / 2 + norms
    tp_bytes = layers * 4 * (2 * (2 - 1) / 2) * h * 2  # 4 all-reduces of h bf16 values per layer: 1 MiB
    assert tp_bytes == 2**20
    tp_ms = tp_bytes / (360e9) * 1e3  # at the H100's 360 GB/s intra-node bus bandwidth
    tp_flops = tp_ms * 1e12 / plain.compute.ms_per_tflop
    static = plain.extra["memory"]["static_bytes"] * params / model.num_params  # ZeRO terms linear in P
    activation = plain.extra["memory"]["activation_bytes_per_token"] / 2
    assert tp2.name == "h100-80g/llama2-7b-tp2"
    assert dataclasses.asdict(tp2.compute) == pytest.approx(
        {
            "flops_per_token": plain.compute.flops_per_token / 2 + tp_flops,
            "flops_per_token_sq": plain.compute.flops_per_token_sq / 2,
            "ms_per_tflop": plain.compute.ms_per_tflop,
            "fixed_ms": plain.compute.fixed_ms + 8 * 0.035 * layers,
        },
        rel=1e-12,
    )
    assert dataclasses.asdict(tp2.comm) == {**dataclasses.asdict(plain.comm), "bytes_per_token": 2**19}
    assert tp2.extra["memory"] == pytest.approx(
        {
            "bucket_rule": "derived",
            "kv_bytes_per_token": plain.kv_bytes_per_token / 2,  # 16 of the 32 K/V heads per rank
            "gathered_kv": "key_prefixes",  # what worker/dacp.py keeps, whatever the TP degree
            "derived_bucket_tokens": int((80 * 2**30 * 0.9 - static) // activation),
            "paper_bucket_tokens": None,
            "static_bytes": static,
            "activation_bytes_per_token": activation,
            "source": plain.extra["memory"]["source"],
        },
        rel=1e-12,
    )
    assert tp2.bucket_tokens == tp2.extra["memory"]["derived_bucket_tokens"] > 2 * plain.bucket_tokens
    assert tp2.microbatch_ms == round(3.0 + 0.25 * 2 * params / 50e9 * 1e3, 6)
    assert tp2.extra["setup"]["tp"] == 2
    tp = tp2.extra["tensor_parallel"]
    assert (tp["degree"], tp["kv_heads_per_rank"], tp["params_per_rank"]) == (2, 16, params)
    assert (tp["comm_bytes_per_token"], tp["comm_ms_per_token"]) == (tp_bytes, pytest.approx(tp_ms, rel=1e-12))
    assert "Korthikanti" in tp["source"] and "replicated" in tp["source"]


def test_replicated_kv_heads_are_charged_whole_to_each_rank() -> None:
    """Two K/V heads over four or eight ranks: each rank holds (and exchanges for CP) one whole head."""
    model = dataclasses.replace(MODELS["llama2-7b"], name="gqa-2", num_kv_heads=2)
    assert [kv_heads_per_tp_rank(model, t) for t in (1, 2, 4, 8)] == [2, 1, 1, 1]
    plain, tp4, tp8 = (_tp("gqa-2", t, model) for t in (1, 4, 8))
    assert tp4.comm.bytes_per_token == tp8.comm.bytes_per_token == plain.comm.bytes_per_token / 2
    h, hd, layers = model.hidden_size, model.head_dim, model.num_layers
    kv_flops = 4 * h * hd  # one K/V head's projection per rank
    for t, profile in ((4, tp4), (8, tp8)):
        split = 3 * layers * (4 * h * h + 16 * h * h) / t
        assert profile.extra["tensor_parallel"]["flops_per_token"] == split + 3 * layers * kv_flops
        assert profile.compute.flops_per_token_sq == plain.compute.flops_per_token_sq / t
        kv_weights = layers * 2 * h * hd  # one K and one V head per rank, whole
        assert params_per_tp_rank(model, t) == (model.num_params - 2 * kv_weights - (2 * h * layers + h)) / t + (
            kv_weights + 2 * h * layers + h
        )
        assert (
            activation_bytes_per_token(model, t)
            == (layers * (8 * h + 4 * h + 8 * model.intermediate_size) + 6 * model.vocab_size) / t + layers * 4 * hd
        )


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_bucket_grows_with_the_tp_degree(name: str) -> None:
    degrees = [t for t in (1, 2, 4, 8) if MODELS[name].num_heads % t == 0]
    buckets = [_tp(name, t).bucket_tokens for t in degrees]
    assert len(buckets) >= 2 and buckets == sorted(set(buckets))


def test_the_paper_bucket_is_scaled_by_the_tp_share_of_activations() -> None:
    """Qwen2.5-7B's measured 13K tokens give the measured bytes per token; at t = 2 (4 K/V heads: none
    replicated) a rank holds half of each token's activations in its own free memory."""
    model, tp2 = MODELS["qwen2.5-7b"], _tp("qwen2.5-7b", 2, paper_bucket=True)
    reference = free_memory_bytes(model, H100, TrainingSetup())
    free = free_memory_bytes(model, H100, TrainingSetup(tp=2))
    assert tp2.extra["memory"]["paper_bucket_tokens"] == 13_000
    assert tp2.bucket_tokens == int(free // (reference / 13_000 / 2)) > 2 * 13_000


@pytest.mark.parametrize(("tp", "words"), [(0, ">= 1"), (-2, ">= 1"), (True, ">= 1"), (3, "32 attention heads")])
def test_a_tp_degree_that_does_not_split_the_model_is_refused_naming_tp(tp: int, words: str) -> None:
    with pytest.raises(RequestError) as err:
        _tp("llama2-7b", tp)
    assert err.value.field == "--tp" and err.value.value == tp and words in str(err.value)
    with pytest.raises(RequestError, match="MLP width 4864"):  # 14 heads split 7 ways, its MLP does not
        _tp("qwen2.5-0.5b", 7)

"""Model shapes from Hugging Face config.json documents: each family's defaults, published parameter
counts, and one clear error per bad key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from skrull.solver.errors import RequestError
from skrull.solver.profiles.derive import MODELS, ModelConfig, activation_bytes_per_token, flops_coefficients
from skrull.solver.profiles.hf_config import default_model_name, model_from_hf_config

#: The shape keys of published config.json files (other keys, e.g. rope settings, do not matter here).
CONFIGS: dict[str, dict[str, Any]] = {
    "llama-3-8b": {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "rope_theta": 500000.0,
    },
    "mistral-7b-v0.1": {
        "model_type": "mistral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
        "tie_word_embeddings": False,
        "sliding_window": 4096,
    },
    "qwen2-7b": {
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
    },
    "gemma-7b": {
        "model_type": "gemma",
        "hidden_size": 3072,
        "intermediate_size": 24576,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "head_dim": 256,
        "vocab_size": 256000,
    },
    "gemma-2b": {
        "model_type": "gemma",
        "hidden_size": 2048,
        "intermediate_size": 16384,
        "num_hidden_layers": 18,
        "num_attention_heads": 8,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "vocab_size": 256000,
    },
}

#: Parameter counts the model cards publish.
PUBLISHED_PARAMS = {
    "llama-3-8b": 8.03e9,
    "mistral-7b-v0.1": 7.24e9,
    "qwen2-7b": 7.62e9,
    "gemma-7b": 8.54e9,
    "gemma-2b": 2.51e9,
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_parameter_count_matches_the_published_size(name: str) -> None:
    model = model_from_hf_config(CONFIGS[name], name=name)
    assert model.num_params == pytest.approx(PUBLISHED_PARAMS[name], rel=0.005)


def test_qwen2_config_gives_the_built_in_qwen_shape_with_its_always_on_qkv_bias() -> None:
    model = model_from_hf_config(CONFIGS["qwen2-7b"], name="qwen2.5-7b")
    built_in = MODELS["qwen2.5-7b"]
    assert model == ModelConfig(**{**_fields(built_in), "source": model.source})
    assert model.qkv_bias is True


def test_llama_style_defaults_multi_head_attention_and_untied_embeddings() -> None:
    doc = {k: v for k, v in CONFIGS["llama-3-8b"].items() if k not in ("num_key_value_heads", "tie_word_embeddings")}
    model = model_from_hf_config(doc, name="x")
    assert (model.num_kv_heads, model.tied_embeddings, model.qkv_bias) == (32, False, False)
    assert model.head_dim_override is None and model.head_dim == 128


def test_gemma_ties_embeddings_by_default_and_keeps_its_own_head_dim() -> None:
    model = model_from_hf_config(CONFIGS["gemma-7b"], name="gemma-7b")
    assert model.tied_embeddings is True
    assert (model.head_dim, model.q_hidden_size, model.kv_hidden_size) == (256, 4096, 4096)
    assert model.head_dim_override == 256


def test_gemma_flops_count_queries_at_their_own_width() -> None:
    model = model_from_hf_config(CONFIGS["gemma-7b"], name="gemma-7b")
    h, q, kv, layers = 3072, 4096, 4096, 28
    assert flops_coefficients(model) == (
        3.0 * layers * (4 * h * q + 16 * h * h + 4 * h * kv),
        3.0 * layers * 4 * q,
    )
    assert activation_bytes_per_token(model) == layers * (8 * h + 4 * q + 4 * kv + 8 * 24576) + 6 * 256000


def test_a_head_dim_equal_to_hidden_over_heads_changes_nothing() -> None:
    explicit = model_from_hf_config({**CONFIGS["llama-3-8b"], "head_dim": 128}, name="x")
    implicit = model_from_hf_config(CONFIGS["llama-3-8b"], name="x")
    assert explicit == implicit


def test_attention_bias_flag_adds_the_bias_parameters() -> None:
    plain = model_from_hf_config(CONFIGS["llama-3-8b"], name="x")
    biased = model_from_hf_config({**CONFIGS["llama-3-8b"], "attention_bias": True}, name="x")
    assert biased.num_params - plain.num_params == 32 * (4096 + 2 * 1024)


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        ({"model_type": "gpt2"}, "config.json: model_type", "supported"),
        ({"model_type": None}, "config.json: model_type", "supported"),
        ({"hidden_size": None}, "config.json: hidden_size", "missing"),
        ({"hidden_size": 4096.0}, "config.json: hidden_size", "integer"),
        ({"hidden_size": True}, "config.json: hidden_size", "integer"),
        ({"num_hidden_layers": 0}, "config.json: num_hidden_layers", "integer"),
        ({"vocab_size": 10**30}, "config.json: vocab_size", "integer"),
        ({"intermediate_size": float("nan")}, "config.json: intermediate_size", "integer"),
        ({"num_key_value_heads": 5}, "config.json: num_key_value_heads", "divide"),
        ({"num_attention_heads": 24}, "config.json: num_attention_heads", "divide"),
        ({"tie_word_embeddings": "yes"}, "config.json: tie_word_embeddings", "true or false"),
        ({"num_local_experts": 8}, "config.json: num_local_experts", "mixture-of-experts"),
        ({"num_experts": 64}, "config.json: num_experts", "mixture-of-experts"),
    ],
)
def test_bad_keys_are_one_error_naming_the_key(change: dict[str, Any], field: str, reason: str) -> None:
    doc = {**CONFIGS["llama-3-8b"], **change}
    with pytest.raises(RequestError) as err:
        model_from_hf_config(doc, name="x")
    assert err.value.field == field
    assert reason in str(err.value)


@pytest.mark.parametrize("doc", [[], "config", 3, None, {"nested": {"deep": [[[]]]}}])
def test_a_document_that_is_not_a_config_is_refused(doc: Any) -> None:
    with pytest.raises(RequestError):
        model_from_hf_config(doc, name="x")


def test_model_name_comes_from_name_or_path_then_the_file_then_the_folder() -> None:
    assert default_model_name({"_name_or_path": "meta-llama/Meta-Llama-3-8B"}, None) == "meta-llama-3-8b"
    assert default_model_name({}, Path("/models/Mistral-7B/config.json")) == "mistral-7b"
    assert default_model_name({}, Path("examples/models/Qwen2-Tiny.json")) == "qwen2-tiny"
    with pytest.raises(RequestError):
        model_from_hf_config(CONFIGS["llama-3-8b"], name="a/b")


def _fields(model: ModelConfig) -> dict[str, Any]:
    return {f: getattr(model, f) for f in ModelConfig.__dataclass_fields__}

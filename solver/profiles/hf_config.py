"""A model shape from a Hugging Face ``config.json`` of a dense decoder (Llama, Mistral, Qwen2/3, Gemma).

The keys read, with the defaults the model families' configuration classes use when a key is absent:
    hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, vocab_size   (required)
    num_key_value_heads   default num_attention_heads (multi-head attention)
    head_dim              default hidden_size / num_attention_heads (Gemma sets it apart)
    tie_word_embeddings   default true for Gemma, false for the others
    attention_bias        q/k/v projection bias; Qwen2 always has it (its config has no such key)

Mixture-of-experts configs are refused: one dense MLP per layer is what the cost model counts. Norms
beyond the two per layer (Gemma 2's extra ones, Qwen3's q/k norms) are not counted: a few thousand
parameters per layer, far below the precision of the derivation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from skrull.solver.errors import RequestError
from skrull.solver.profiles.derive import ModelConfig

#: model_type -> whether the embeddings are tied when the config does not say.
TIED_BY_DEFAULT: dict[str, bool] = {
    "llama": False,
    "mistral": False,
    "qwen2": False,
    "qwen3": False,
    "gemma": True,
    "gemma2": True,
}
#: Families whose attention always has q/k/v biases.
QKV_BIAS_ALWAYS = frozenset({"qwen2"})
#: Keys that mark a mixture-of-experts config (any value above 1).
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
#: Far above any real model; bounds hostile values before they reach the arithmetic.
MAX_DIMENSION = 2**24


def _positive_int(doc: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = doc.get(key, default)
    if value is None:
        raise RequestError(f"{where}: {key}", None, "required integer is missing")
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DIMENSION:
        raise RequestError(f"{where}: {key}", value, f"must be an integer in 1..{MAX_DIMENSION}")
    return value


def _flag(doc: dict[str, Any], key: str, where: str, default: bool) -> bool:
    value = doc.get(key, default)
    if not isinstance(value, bool):
        raise RequestError(f"{where}: {key}", value, "must be true or false")
    return value


def default_model_name(doc: dict[str, Any], path: Path | None) -> str:
    """``_name_or_path``'s last part, else the file's own name when it is not ``config.json``
    (``models/qwen2-tiny.json``: ``qwen2-tiny``), else the folder holding it, lower-cased (no ``/``)."""
    raw = doc.get("_name_or_path")
    if isinstance(raw, str) and raw.strip("/"):
        return raw.strip("/").rsplit("/", 1)[-1].lower()
    if path is not None and path.name != "config.json" and path.stem:
        return path.stem.lower()
    if path is not None and path.resolve().parent.name:
        return path.resolve().parent.name.lower()
    return str(doc.get("model_type", "model"))


def model_from_hf_config(doc: Any, *, name: str, where: str = "config.json") -> ModelConfig:
    """The shape of a dense decoder from its ``config.json`` document; one clear error per bad key."""
    if not isinstance(doc, dict):
        raise RequestError(where, type(doc).__name__, "must be a JSON object")
    model_type = doc.get("model_type")
    if model_type not in TIED_BY_DEFAULT:
        raise RequestError(f"{where}: model_type", model_type, f"supported: {', '.join(TIED_BY_DEFAULT)}")
    for key in MOE_KEYS:
        experts = doc.get(key)
        if isinstance(experts, int) and not isinstance(experts, bool) and experts > 1:
            raise RequestError(f"{where}: {key}", experts, "mixture-of-experts models are not modelled")
    if not name or "/" in name:
        raise RequestError("--name", name, "must be a non-empty name without '/'")
    hidden = _positive_int(doc, "hidden_size", where)
    heads = _positive_int(doc, "num_attention_heads", where)
    kv_heads = _positive_int(doc, "num_key_value_heads", where, default=heads)
    if heads % kv_heads:
        raise RequestError(f"{where}: num_key_value_heads", kv_heads, f"must divide num_attention_heads ({heads})")
    if doc.get("head_dim") is None and hidden % heads:
        raise RequestError(f"{where}: num_attention_heads", heads, f"must divide hidden_size ({hidden})")
    head_dim = _positive_int(doc, "head_dim", where, default=hidden // heads)
    return ModelConfig(
        name=name,
        hidden_size=hidden,
        num_layers=_positive_int(doc, "num_hidden_layers", where),
        num_heads=heads,
        num_kv_heads=kv_heads,
        intermediate_size=_positive_int(doc, "intermediate_size", where),
        vocab_size=_positive_int(doc, "vocab_size", where),
        tied_embeddings=_flag(doc, "tie_word_embeddings", where, TIED_BY_DEFAULT[model_type]),
        qkv_bias=model_type in QKV_BIAS_ALWAYS or _flag(doc, "attention_bias", where, False),
        source=f"{where} (model_type {model_type})",
        head_dim_override=None if head_dim * heads == hidden else head_dim,
    )

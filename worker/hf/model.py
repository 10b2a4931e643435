"""A Hugging Face causal LM from a ``config.json`` alone: seeded random weights, nothing downloaded.

Every process of a run builds the model on the CPU from the same seed, so all hold the same weights
without broadcasting them, then moves it to its device. The architectures whose attention goes through
``transformers``' attention interface with rotary positions from ``position_ids`` qualify: Llama, Qwen2,
Qwen3, Mistral, Phi-3, Gemma 2 (logit soft-capping and sliding windows computed by the DACP attention),
Gemma 3, OLMo 2 and the mixtures of experts Qwen2-MoE, Qwen3-MoE and Mixtral (the router's auxiliary loss
off, or per microbatch with ``router_aux_loss="per_microbatch"``; ``SUPPORTED_MODEL_TYPES``), each checked
against the plain step under torchrun (tests/conformance, docs/integrations/conformance.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from skrull.solver.errors import RequestError
from skrull.solver.io import read_json
from skrull.worker.hf.attention import SUPPORTED_MODEL_TYPES, register, unsupported_model_setting

__all__ = ["SUPPORTED_MODEL_TYPES", "build_model", "check_model_config", "read_model_config"]
#: Largest size field accepted (int32: tensor dimensions and token ids).
MAX_SIZE = 2**31 - 1


def read_model_config(
    path: str | Path, *, field: str = "--model-config", router_aux_loss: str | None = None
) -> dict[str, Any]:
    """The ``config.json`` document, checked for what DACP needs (one clear error naming the field);
    ``router_aux_loss``: the router auxiliary loss's semantics asked for (worker/hf/router_loss.py)."""
    doc = read_json(str(path), field=field)
    check_model_config(doc, field=field, router_aux_loss=router_aux_loss)
    assert isinstance(doc, dict)
    return doc


def check_model_config(doc: Any, *, field: str = "--model-config", router_aux_loss: str | None = None) -> None:
    if not isinstance(doc, dict):
        raise RequestError(field, doc, "must be a Hugging Face config.json object")
    model_type = doc.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise RequestError(
            f"{field}.model_type", model_type, f"unsupported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"):
        value = doc.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SIZE:
            raise RequestError(f"{field}.{key}", value, f"must be an integer in 1..{MAX_SIZE}")
    heads, kv_heads = doc["num_attention_heads"], doc.get("num_key_value_heads", doc["num_attention_heads"])
    if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads < 1 or heads % kv_heads:
        raise RequestError(f"{field}.num_key_value_heads", kv_heads, f"must divide num_attention_heads ({heads})")
    head_dim = doc.get("head_dim")
    if head_dim is None:
        if doc["hidden_size"] % heads:
            raise RequestError(
                f"{field}.hidden_size", doc["hidden_size"], f"must be a multiple of num_attention_heads ({heads})"
            )
        head_dim = doc["hidden_size"] // heads
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or not 2 <= head_dim <= MAX_SIZE or head_dim % 2:
        raise RequestError(f"{field}.head_dim", head_dim, "must be an even integer >= 2 (rotary embedding)")
    window = doc.get("sliding_window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise RequestError(f"{field}.sliding_window", window, "must be an integer >= 1 or null")
    dropout = doc.get("attention_dropout", 0.0)
    if dropout not in (0, 0.0):
        raise RequestError(f"{field}.attention_dropout", dropout, "must be 0 (no attention dropout under DACP)")
    found = unsupported_model_setting(doc, router_aux_loss=router_aux_loss)  # the router's aux loss, attention
    if found is not None:
        key, value, why = found
        raise RequestError(f"{field}.{key}", value, why)


def build_model(
    config: Mapping[str, Any],
    *,
    seed: int,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str | None = None,
    router_aux_loss: str | None = None,
) -> Any:
    """``AutoModelForCausalLM.from_config`` with weights drawn from ``seed`` on the CPU, in train mode.

    ``attn_implementation`` defaults to DACP (registered here); the plain reference passes ``"eager"``.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    check_model_config(dict(config), router_aux_loss=router_aux_loss)
    doc = dict(config)
    hf_config = AutoConfig.for_model(doc.pop("model_type"), **doc)
    implementation = attn_implementation or register()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
        hf_config, attn_implementation=implementation, dtype=torch.float32
    )
    model.to(device=device or torch.device("cpu"), dtype=dtype)
    model.train()
    return model


#: The projections LoRA adapts in ``with_lora``: attention's and the dense MLP's (a mixture of experts' fused
#: expert weights are parameters, not linear modules, and stay frozen).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def with_lora(model: Any, *, rank: int, seed: int) -> Any:
    """``peft.get_peft_model(model, LoraConfig(r=rank, ...))`` with both factors drawn from ``seed``, as the
    examples' ``--lora`` and the conformance matrix use it: the base weights frozen, only the adapters train.

    PEFT's default zero-initialises ``B``, so the first step's gradient of every ``A`` is exactly 0 and a check
    of it would compare zeros; here ``B`` is random too (``init_lora_weights=False``), which makes the adapted
    model differ from the base one and every adapter's first gradient non-zero. ``lora_dropout`` stays 0: a
    random mask per token, drawn on other ranks under plans than in the plain step."""
    from peft import LoraConfig, get_peft_model

    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"lora rank {rank!r}: must be an integer >= 1")
    torch.manual_seed(seed)
    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=list(LORA_TARGETS), init_lora_weights=False
    )
    return get_peft_model(model, config)

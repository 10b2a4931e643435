"""Profiles derived for models and GPUs beyond the bundled ones, shared by bench/cp_modes.py and
bench/never_behind.py: Llama-2-7B, Llama-2-13B and Llama-2-70B (64 heads, 8 K/V) at TP 8 and TP 1, plus
Qwen2.5-7B (28 heads, 4 K/V), on A100, H100, H200 and B200 shapes (solver/profiles/gpus.py figures)."""

from __future__ import annotations

from skrull.solver.profile import Profile, profile_from_dict
from skrull.solver.profiles.derive import MODELS, TrainingSetup, derive_profile
from skrull.solver.profiles.gpus import GPUS
from skrull.solver.profiles.hf_config import model_from_hf_config

#: meta-llama/Llama-2-70b-hf config.json (Touvron et al. 2023, table 1 and the released config)
LLAMA2_70B = model_from_hf_config(
    {
        "hidden_size": 8192,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "intermediate_size": 28672,
        "vocab_size": 32000,
        "model_type": "llama",
    },
    name="llama2-70b",
)
GPU_NAMES = ("a100-80g", "h100-80g", "h200-141g", "b200-180g")


def derived(model_name: str, gpu: str, *, tp: int = 1, zero_dp: int = 8) -> Profile:
    """``model_name`` on ``gpu``'s shape at TP ``tp``; the Llama-2 models with ZeRO-3 over ``zero_dp`` ranks
    (Llama-2-70B at TP 1 needs 64 to leave a bucket of some thousand tokens: 64 heads, 8 K/V).

    The profile as ``skrull derive-profile`` writes it and a request loads it (the contract's document read
    back), so it plans with every section written: ``topology`` (8 GPUs a node, NVLink inside, InfiniBand
    across), ``memory.kv_bytes_per_token`` and ``overlap``."""
    model = LLAMA2_70B if model_name == "llama2-70b" else MODELS[model_name]
    setup = TrainingSetup(tp=tp, dp=zero_dp, zero_stage=3) if model_name != "qwen2.5-7b" else TrainingSetup(tp=tp)
    return profile_from_dict(derive_profile(model, GPUS[gpu], setup).to_dict())


def tp8_profiles() -> list[Profile]:
    """7B, 13B and 70B at TP 8 on every GPU shape (bench/never_behind.py, item 5 of the bench's brief)."""
    return [derived(m, g, tp=8) for m in ("llama2-7b", "llama2-13b", "llama2-70b") for g in GPU_NAMES]

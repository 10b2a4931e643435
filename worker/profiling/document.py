"""The measured profile document: the specification's fields fitted from raw measurements, which are kept.

The result is a profile in docs/formats.md format (``compute``, ``comm``, ``memory.bucket_tokens``,
``microbatch_ms``) that ``solver.profile.profile_from_dict`` reads, with ``"estimated": false`` and
extra fields: where and when it was measured (``measured``), the model shape, every raw measurement,
the fits' R^2 and the attention efficiency table. What was not measured says so and keeps the derived
value (``comm`` on one GPU, ``microbatch_ms`` always: framework overhead per microbatch is outside a
single-layer measurement).

Coefficient by coefficient (see worker/profiling/fit.py for the fits):

- ``compute.flops_per_token``: Skrull eq. 13 x layers x 3 for the model; ``ms_per_tflop``,
  ``flops_per_token_sq`` (effective) and ``fixed_ms``: the two-term compute fit (``_compute_section``).
- ``comm.bytes_per_token``: K and V of every layer, all-gathered forward and reduce-scattered backward,
  in the training dtype's bytes; ``ms_per_mib``: the per-collective fit against gathered bytes;
  ``fixed_ms``: the per-collective intercept x 2 collectives x layers.
- ``heads`` and ``comm_a2a`` (what planning ``ulysses`` needs): the model's attention and K/V heads;
  ``comm_a2a.bytes_per_token`` and ``kv_bytes_per_token`` as derived (solver/profiles/derive.py), ``ms_per_mib`` the
  fit of timed all-to-alls against the bytes each member sends, ``fixed_ms`` its intercept x 4 collectives x
  layers; on one GPU the derived values, marked so.
- ``memory.bucket_tokens``: ``(capacity * (1 - reserve) - static) / alpha`` with ``alpha`` = layers x
  the fitted per-layer activation bytes (the larger of the saved-for-backward and the allocator-peak
  slopes on a GPU, so the bucket errs on the safe side) + the LM head's logits (bf16 logits and their fp32 copy,
  ``6 * vocab`` bytes per token; solver/profiles/derive.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from skrull.solver.profiles.derive import (
    A2A_COLLECTIVES_PER_LAYER,
    MODELS,
    ModelConfig,
    TrainingSetup,
    a2a_bytes_per_token,
    a2a_kv_bytes_per_token,
    comm_bytes_per_token,
    flops_coefficients,
    kv_heads_per_tp_rank,
    static_memory_bytes,
)
from skrull.worker.profiling.fit import (
    ALL_GATHER,
    ALL_TO_ALL,
    AttentionPoint,
    CommSample,
    ComputeSample,
    MemorySample,
    attention_efficiency,
    bucket_tokens,
    fit_activation_bytes,
    fit_comm,
    fit_compute_terms,
    fit_line,
)


def _model_doc(model: ModelConfig) -> dict[str, Any]:
    doc = dataclasses.asdict(model)
    doc["head_dim"] = model.head_dim
    doc["kv_hidden_size"] = model.kv_hidden_size
    doc["num_params"] = model.num_params
    return doc


def model_from_doc(doc: Any) -> ModelConfig:
    """The model shape stored in a profile's ``model`` field (measured or derived profiles)."""
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    if isinstance(doc, dict) and doc.get("name") in MODELS and "hidden_size" not in doc:
        return MODELS[doc["name"]]
    if not isinstance(doc, dict) or not {"hidden_size", "num_layers", "num_heads", "num_kv_heads"} <= set(doc):
        raise ValueError("profile.model must give hidden_size, num_layers, num_heads and num_kv_heads")
    values = {k: v for k, v in doc.items() if k in fields}
    values.setdefault("name", "model")
    values.setdefault("intermediate_size", 4 * int(doc["hidden_size"]))
    values.setdefault("vocab_size", 32000)
    values.setdefault("tied_embeddings", False)
    values.setdefault("qkv_bias", False)
    values.setdefault("source", "profile")
    head_dim = doc.get("head_dim")
    if isinstance(head_dim, int) and head_dim * int(doc["num_heads"]) != int(doc["hidden_size"]):
        values.setdefault("head_dim_override", head_dim)  # derived profiles of Gemma-style configs
    return ModelConfig(**values)


def _memory_section(
    model: ModelConfig, memory_samples: Sequence[MemorySample], *, capacity_bytes: float, setup: TrainingSetup
) -> dict[str, Any]:
    """The ``memory`` block: activation bytes per token fitted per layer, the static bytes, the bucket."""
    saved_alpha, beta_layer, memory_r2 = fit_activation_bytes(memory_samples)
    peaks = [m for m in memory_samples if m.peak_bytes is not None]
    peak_alpha = None
    if len(peaks) >= 2:
        peak_alpha = fit_line([m.tokens for m in peaks], [float(m.peak_bytes or 0.0) for m in peaks], what="peak").slope
    alpha_layer = max(saved_alpha, peak_alpha or 0.0)
    logits_bytes = 6.0 * model.vocab_size
    alpha = model.num_layers * alpha_layer + logits_bytes
    static = static_memory_bytes(model, setup)
    bucket = bucket_tokens(
        capacity_bytes=capacity_bytes,
        reserve_fraction=setup.reserve_fraction,
        static_bytes=static,
        activation_bytes_per_token=alpha,
    )
    return {
        "bucket_tokens": bucket,
        "activation_bytes_per_token": round(alpha, 3),
        "activation_bytes_per_token_per_layer": round(alpha_layer, 3),
        "saved_bytes_per_token_per_layer": round(saved_alpha, 3),
        "peak_bytes_per_token_per_layer": None if peak_alpha is None else round(peak_alpha, 3),
        "activation_bytes_fixed_per_layer": round(beta_layer, 3),
        "logits_bytes_per_token": logits_bytes,
        "static_bytes": static,
        "capacity_bytes": capacity_bytes,
        "reserve_fraction": setup.reserve_fraction,
        "r2": round(memory_r2, 6),
        "source": "per layer: the larger of the slopes of bytes saved for backward (unique storages) and of "
        "the allocator's forward peak (GPU) vs tokens; x layers, + logits; "
        "static: weights, gradients and Adam states under the setup's ZeRO stage "
        "(solver/profiles/derive.py)",
        "samples": [dataclasses.asdict(s) for s in memory_samples],
    }


def _timed_or_derived(
    samples: Sequence[CommSample], *, collectives: int, num_layers: int, timed: str, derived: dict[str, float]
) -> dict[str, Any]:
    """``ms_per_mib`` and ``fixed_ms`` of one collective's section: the fit of ``samples`` (``fixed_ms`` = the
    intercept, at least 0, x ``collectives`` per layer x layers), else the derived values, marked so."""
    if not samples:
        return {
            "ms_per_mib": derived["ms_per_mib"],
            "fixed_ms": derived["fixed_ms"],
            "measured": False,
            "source": "one GPU: no collective to time; derived values kept (solver/profiles/derive.py)",
        }
    ms_per_mib, per_collective_ms, r2 = fit_comm(samples)
    return {
        "ms_per_mib": round(ms_per_mib, 8),
        "fixed_ms": round(max(per_collective_ms, 0.0) * collectives * num_layers, 6),
        "measured": True,
        "r2": round(r2, 6),
        "group_size": samples[0].group_size,
        "source": f"{timed} per collective; fixed_ms = intercept x {collectives} collectives x layers",
        "samples": [dataclasses.asdict(s) for s in samples],
    }


def _comm_section(
    model: ModelConfig, comm_samples: Sequence[CommSample], *, bytes_per_value: int, derived_comm: dict[str, float]
) -> dict[str, Any]:
    """The ``comm`` block: fitted from timed all-gathers, else the derived values."""
    return {
        "bytes_per_token": comm_bytes_per_token(model, bytes_per_value=bytes_per_value),
        **_timed_or_derived(
            [s for s in comm_samples if s.collective == ALL_GATHER],
            collectives=2,
            num_layers=model.num_layers,
            timed="all-gather time vs gathered bytes",
            derived=derived_comm,
        ),
    }


def _comm_a2a_section(
    model: ModelConfig, comm_samples: Sequence[CommSample], *, bytes_per_value: int, derived_a2a: dict[str, float]
) -> dict[str, Any]:
    """The ``comm_a2a`` block (Ulysses): bytes as derived, fitted from timed all-to-alls, else derived."""
    return {
        "bytes_per_token": a2a_bytes_per_token(model, bytes_per_value=bytes_per_value),
        "kv_bytes_per_token": a2a_kv_bytes_per_token(model, bytes_per_value=bytes_per_value),
        **_timed_or_derived(
            [s for s in comm_samples if s.collective == ALL_TO_ALL],
            collectives=A2A_COLLECTIVES_PER_LAYER,
            num_layers=model.num_layers,
            timed="all-to-all time vs bytes each member sends",
            derived=derived_a2a,
        ),
    }


def _compute_section(model: ModelConfig, compute_samples: Sequence[ComputeSample]) -> dict[str, Any]:
    """The ``compute`` block: eq. 13's token FLOPs, the rate and the squared term fitted on timed packs.

    ``ms_per_tflop = a * 1e12 / flops_per_token`` and ``flops_per_token_sq = b * 1e12 / ms_per_tflop``
    for the fit ``ms = a * sum(S) + b * sum(S^2) + fixed_ms`` (worker/profiling/fit.py), so the
    cost model's ``ms_per_tflop * (flops_per_token * S + flops_per_token_sq * S^2) / 1e12`` reproduces the
    fit exactly; eq. 13's own squared coefficient is kept beside it as ``flops_per_token_sq_eq13``.
    """
    per_token, per_token_sq = flops_coefficients(model)
    terms = fit_compute_terms(compute_samples)
    ms_per_tflop = terms.ms_per_token * 1e12 / per_token
    return {
        "flops_per_token": per_token,
        "flops_per_token_sq": round(terms.ms_per_token_sq * 1e12 / ms_per_tflop, 3),
        "flops_per_token_sq_eq13": per_token_sq,
        "ms_per_tflop": round(ms_per_tflop, 6),
        "fixed_ms": round(terms.fixed_ms, 6),
        "r2": round(terms.r2, 6),
        "median_abs_rel_error": round(terms.median_abs_rel_error, 6),
        "source": "flops_per_token: Skrull eq. 13 x layers x 3; ms: layers x one decoder layer forward+backward "
        "+ the LM head and its loss, relative least squares of ms on sum(S), sum(S^2) and 1 over packs of "
        "sequences; flops_per_token_sq: the fitted squared term at the token term's rate",
        "samples": [{"lengths": list(s.lengths), "flops": s.flops, "ms": round(s.ms, 6)} for s in compute_samples],
    }


def profile_document(
    *,
    name: str,
    model: ModelConfig,
    measured: dict[str, Any],
    compute_samples: Sequence[ComputeSample],
    attention_points: Sequence[AttentionPoint],
    memory_samples: Sequence[MemorySample],
    comm_samples: Sequence[CommSample],
    capacity_bytes: float,
    setup: TrainingSetup,
    bytes_per_value: int,
    derived_comm: dict[str, float],
    derived_microbatch_ms: float,
    derived_a2a: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Fit every coefficient and lay the profile out in the specification's format (see module docstring).
    ``heads`` and ``comm_a2a`` are written when all-to-alls were timed or ``derived_a2a`` is given."""
    ulysses: dict[str, Any] = {}
    if derived_a2a is not None or any(s.collective == ALL_TO_ALL for s in comm_samples):
        ulysses["heads"] = {
            "attention": model.num_heads,
            "kv": kv_heads_per_tp_rank(model),
            "source": "the model's attention and K/V heads: Ulysses splits the attention heads over the group",
        }
        ulysses["comm_a2a"] = _comm_a2a_section(
            model, comm_samples, bytes_per_value=bytes_per_value, derived_a2a=derived_a2a or {}
        )
    return {
        "name": name,
        "estimated": False,
        "measured": measured,
        "model": _model_doc(model),
        "setup": dataclasses.asdict(setup),
        "compute": _compute_section(model, compute_samples),
        "attention": {
            "source": "causal attention forward+backward alone, one sequence per length; FLOPs 3 x 4*h*S^2",
            "by_query_tokens": attention_efficiency(attention_points),
        },
        "comm": _comm_section(model, comm_samples, bytes_per_value=bytes_per_value, derived_comm=derived_comm),
        **ulysses,
        "memory": _memory_section(model, memory_samples, capacity_bytes=capacity_bytes, setup=setup),
        "microbatch_ms": derived_microbatch_ms,
        "microbatch_source": "derived (solver/profiles/derive.py): framework overhead is outside a one-layer "
        "measurement",
    }

"""Derive a profile from a model config and GPU figures (estimates until measured by ``skrull profile``).

Compute (Skrull appendix C.2, eq. 13, per layer forward, packed so b = 1):
    FLOPs_layer_fwd(S) = 20*h^2*S + 4*h*h_kv*S + 4*h*S^2
    flops_per_token    = 3 * layers * (20*h^2 + 4*h*h_kv)      (x3: forward + backward)
    flops_per_token_sq = 3 * layers * 4*h
    (q = heads * head_dim is h for all but Gemma-style configs; ``flops_coefficients`` says how q enters)
    ms_per_tflop       = 1e3 / (peak_bf16_tflops * mfu)

Communication (Skrull appendix C.3, eq. 15; Llama-3-style all-gather CP): forward all-gathers K and V
(``2 * h_kv`` values per token per layer), backward reduce-scatters their gradients (the same again), in
bf16 (2 bytes):
    bytes_per_token = layers * 2 (K, V) * h_kv * 2 bytes * 2 (fwd + bwd)
    ms_per_mib      = 2^20 / achieved_bus_bandwidth

Memory (Skrull appendix C.1, ``Memory(S) = alpha*S + beta`` with beta ~ 0):
    static = weights (2P bytes, bf16) + gradients (2P, split over dp under ZeRO-2/3)
             + optimizer states (12P: fp32 master, Adam m and v; split over dp under ZeRO-1/2/3)
             (weights also split over dp under ZeRO-3)            [Rajbhandari et al., ZeRO, SC'20, sec. 3]
    alpha  = layers * (12*h + 4*h_kv + 8*I) + 6*V bytes per token   (8*h + 4*q for 12*h when q != h)
             (per layer, bf16, with flash-attention and no recompute inside the layer: norm inputs and
             outputs, Q/K/V and attention output, gate/up/SiLU/product of the SwiGLU MLP; Korthikanti et
             al. 2022, "Reducing Activation Recomputation", sec. 4, adapted to GQA and SwiGLU; plus bf16
             logits and their fp32 copy for the loss)
    bucket_tokens = (capacity * (1 - reserve) - static) / alpha

Per-microbatch overhead: ``framework_ms`` (launches, data movement, hooks) plus the part of ZeRO-2's
per-micro-step gradient reduction that backward does not hide:
    microbatch_ms = framework_ms + (1 - overlap) * 2P bytes / dp_bandwidth

Every constant below carries its source; what is assumed says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from skrull.solver.gpus import GPUS as GPUS  # re-exported: callers take models and GPUs from here
from skrull.solver.gpus import GpuSpec as GpuSpec
from skrull.solver.profile import CommCoeffs, ComputeCoeffs, Profile


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool
    qkv_bias: bool
    source: str
    #: The config's ``head_dim`` where ``num_heads * head_dim != hidden_size`` (Gemma); None: hidden / heads.
    head_dim_override: int | None = None

    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.hidden_size // self.num_heads

    @property
    def q_hidden_size(self) -> int:
        """Width of the queries and of the attention output (``hidden_size`` unless head_dim is set apart)."""
        return self.num_heads * self.head_dim

    @property
    def kv_hidden_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def num_params(self) -> int:
        """Parameter count from the config (embeddings, attention, SwiGLU MLP, RMSNorms)."""
        h, q, kv, i = self.hidden_size, self.q_hidden_size, self.kv_hidden_size, self.intermediate_size
        attn = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if self.qkv_bias else 0)
        layer = attn + 3 * h * i + 2 * h
        embed = self.vocab_size * h * (1 if self.tied_embeddings else 2)
        return self.num_layers * layer + embed + h


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingSetup:
    """Assumptions about the training run; the defaults are Skrull's section 5.1 setup."""

    dp: int = 4
    zero_stage: int = 2
    mfu: float = 0.30
    reserve_fraction: float = 0.10
    compute_fixed_ms_per_layer: float = 0.0625
    collectives_per_layer: int = 2
    collective_latency_ms: float = 0.035
    framework_ms: float = 3.0
    grad_reduce_overlap: float = 0.75


def _model(
    name: str, shape: tuple[int, int, int, int, int, int], tied: bool, qkv_bias: bool, source: str
) -> ModelConfig:
    """``shape`` = (hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size, vocab_size)."""
    hidden, layers, heads, kv_heads, intermediate, vocab = shape
    return ModelConfig(
        name=name,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        intermediate_size=intermediate,
        vocab_size=vocab,
        tied_embeddings=tied,
        qkv_bias=qkv_bias,
        source=source,
    )


QWEN25 = "Qwen2.5 technical report, 2024, table 1"
LLAMA2 = "Touvron et al. 2023, table 1"
#: The four built-in models, from their config.json: name, (hidden, layers, heads, kv heads, MLP width,
#: vocabulary), tied embeddings, q/k/v biases, source.
MODELS: dict[str, ModelConfig] = {
    row[0]: _model(*row)
    for row in (
        ("qwen2.5-0.5b", (896, 24, 14, 2, 4864, 151936), True, True, f"Qwen/Qwen2.5-0.5B config.json ({QWEN25})"),
        ("qwen2.5-7b", (3584, 28, 28, 4, 18944, 152064), False, True, f"Qwen/Qwen2.5-7B config.json ({QWEN25})"),
        (
            "llama2-7b",
            (4096, 32, 32, 32, 11008, 32000),
            False,
            False,
            f"meta-llama/Llama-2-7b-hf config.json ({LLAMA2})",
        ),
        (
            "llama2-13b",
            (5120, 40, 40, 40, 13824, 32000),
            False,
            False,
            f"meta-llama/Llama-2-13b-hf config.json ({LLAMA2})",
        ),
    )
}

#: Training setups per model: Skrull's <DP=4, ZeRO-2> where it fits; Llama2-13B needs ZeRO-3 over DP=8
#: to leave room for activations on 80 GB (ZeRO-2 at DP=4 keeps 72 GB of static state per GPU).
SETUPS: dict[str, TrainingSetup] = {"llama2-13b": TrainingSetup(dp=8, zero_stage=3)}

#: Buckets Skrull measured (section 5.1: "BucketSize 26K for Qwen2.5-0.5B and 13K for Qwen2.5-7B"), on
#: 80 GB H100s with the default setup. They calibrate that model's activation bytes per token
#: (free memory on the H100 / measured bucket), which then prices the free memory of any other GPU;
#: other models and setups use the derivation alone.
PAPER_BUCKET_TOKENS: dict[str, int] = {"qwen2.5-0.5b": 26_000, "qwen2.5-7b": 13_000}
PAPER_GPU = "h100-80g"


def flops_coefficients(model: ModelConfig) -> tuple[float, float]:
    """(flops_per_token, flops_per_token_sq): Skrull eq. 13 x layers x 3.

    Eq. 13's ``20*h^2`` is the query and output projections (``4*h^2``) plus the MLP (``16*h^2``), and its
    ``4*h*S^2`` is the two attention matmuls; with queries of width ``q = heads * head_dim != h`` (Gemma)
    those terms become ``4*h*q`` and ``4*q*S^2``. For every model with ``q == h`` this is eq. 13 exactly.
    """
    h, q, kv = model.hidden_size, model.q_hidden_size, model.kv_hidden_size
    per_token = 3 * model.num_layers * (4 * h * q + 16 * h * h + 4 * h * kv)
    per_token_sq = 3 * model.num_layers * 4 * q
    return float(per_token), float(per_token_sq)


def comm_bytes_per_token(model: ModelConfig, *, bytes_per_value: int = 2) -> float:
    """K and V gathered forward and their gradients reduced backward, every layer."""
    return float(model.num_layers * 2 * model.kv_hidden_size * bytes_per_value * 2)


def static_memory_bytes(model: ModelConfig, setup: TrainingSetup) -> float:
    p = model.num_params
    weights = 2.0 * p / (setup.dp if setup.zero_stage >= 3 else 1)
    grads = 2.0 * p / (setup.dp if setup.zero_stage >= 2 else 1)
    optimizer = 12.0 * p / (setup.dp if setup.zero_stage >= 1 else 1)
    return weights + grads + optimizer


def activation_bytes_per_token(model: ModelConfig) -> float:
    """``layers * (8*h + 4*q + 4*h_kv + 8*I) + 6*V``: the module docstring's ``12*h`` with the queries and
    attention output (``4*h`` of it) counted at their own width ``q``."""
    h, q, kv, i = model.hidden_size, model.q_hidden_size, model.kv_hidden_size, model.intermediate_size
    return float(model.num_layers * (8 * h + 4 * q + 4 * kv + 8 * i) + 6 * model.vocab_size)


def derived_bucket_tokens(model: ModelConfig, gpu: GpuSpec, setup: TrainingSetup) -> int:
    free = free_memory_bytes(model, gpu, setup)
    if free <= 0:
        return 0
    return int(free // activation_bytes_per_token(model))


def free_memory_bytes(model: ModelConfig, gpu: GpuSpec, setup: TrainingSetup) -> float:
    """What activations may use: the GPU's memory less the reserve and the static training state."""
    return gpu.memory_bytes * (1.0 - setup.reserve_fraction) - static_memory_bytes(model, setup)


def calibrated_bucket_tokens(model: ModelConfig, gpu: GpuSpec, setup: TrainingSetup, paper_tokens: int) -> int:
    """``paper_tokens * free(gpu) / free(H100 80 GB)``: the measured bucket scaled by free memory, so that
    the measured activation bytes per token (not the formula's) price every GPU; exactly the paper's
    value on the GPU it was measured on."""
    free = free_memory_bytes(model, gpu, setup)
    reference = free_memory_bytes(model, GPUS[PAPER_GPU], setup)
    if free <= 0:
        return 0
    if gpu.memory_bytes == GPUS[PAPER_GPU].memory_bytes:
        return paper_tokens
    return int(paper_tokens * free / reference)


def derive_profile(model: ModelConfig, gpu: GpuSpec, setup: TrainingSetup | None = None) -> Profile:
    """A profile with every number's source; ``estimated: true`` until ``skrull profile`` measures it.

    The bucket is Skrull's measured value where the paper gives one (Qwen2.5-0.5B, 7B with the default
    setup), scaled by free memory to other GPUs (``calibrated_bucket_tokens``), otherwise the derivation;
    both are recorded under ``memory``.
    """
    setup = setup or SETUPS.get(model.name, TrainingSetup())
    fpt, fpt_sq = flops_coefficients(model)
    bpt = comm_bytes_per_token(model)
    derived = derived_bucket_tokens(model, gpu, setup)
    paper = PAPER_BUCKET_TOKENS.get(model.name) if setup == TrainingSetup() else None
    bucket = derived if paper is None else calibrated_bucket_tokens(model, gpu, setup, paper)
    ms_per_tflop = 1e3 / (gpu.peak_bf16_tflops * setup.mfu)
    ms_per_mib = 2**20 / (gpu.cp_bus_bandwidth_gbs * 1e9) * 1e3
    grad_ms = 2.0 * model.num_params / (gpu.dp_bandwidth_gbs * 1e9) * 1e3
    microbatch_ms = setup.framework_ms + (1.0 - setup.grad_reduce_overlap) * grad_ms
    extra: dict[str, Any] = {
        "estimated": True,
        "model": {
            "name": model.name,
            "hidden_size": model.hidden_size,
            "num_layers": model.num_layers,
            "num_heads": model.num_heads,
            "num_kv_heads": model.num_kv_heads,
            "head_dim": model.head_dim,
            "kv_hidden_size": model.kv_hidden_size,
            "intermediate_size": model.intermediate_size,
            "vocab_size": model.vocab_size,
            "num_params": model.num_params,
            "source": model.source,
        },
        "gpu": {"name": gpu.name, "memory_bytes": gpu.memory_bytes, "source": gpu.source},
        "setup": {
            "dp": setup.dp,
            "zero_stage": setup.zero_stage,
            "mfu": setup.mfu,
            "reserve_fraction": setup.reserve_fraction,
            "source": "Skrull section 5.1 (DeepSpeed ZeRO-2, DP=4) unless noted in solver/derive.py SETUPS; "
            "MFU 0.30 and 10% reserve assumed",
        },
        "compute": {
            "source": "flops: Skrull eq. 13 x layers x 3; ms_per_tflop = 1e3 / (peak * mfu); "
            f"fixed_ms = {setup.compute_fixed_ms_per_layer} ms per layer of launches (assumed)",
        },
        "comm": {
            "source": "bytes: layers * 2 (K,V) * kv_hidden * 2 B * 2 (fwd all-gather + bwd reduce-scatter); "
            f"ms_per_mib from {gpu.cp_bus_bandwidth_gbs} GB/s bus bandwidth; fixed_ms = "
            f"{setup.collectives_per_layer} collectives x {setup.collective_latency_ms} ms per layer (assumed)",
        },
        "memory": {
            "derived_bucket_tokens": derived,
            "paper_bucket_tokens": paper,
            "static_bytes": static_memory_bytes(model, setup),
            "activation_bytes_per_token": activation_bytes_per_token(model),
            "source": "bucket_tokens: Skrull section 5.1 where given (scaled by free memory off the 80 GB H100), "
            "else derived (solver/derive.py)",
        },
        "microbatch_source": f"{setup.framework_ms} ms framework (assumed) + {1 - setup.grad_reduce_overlap:.2f} x "
        f"ZeRO-2 gradient reduction of 2P bytes at {gpu.dp_bandwidth_gbs} GB/s",
    }
    return Profile(
        name=f"{gpu.name}/{model.name}",
        compute=ComputeCoeffs(
            flops_per_token=fpt,
            flops_per_token_sq=fpt_sq,
            ms_per_tflop=round(ms_per_tflop, 6),
            fixed_ms=round(setup.compute_fixed_ms_per_layer * model.num_layers, 6),
        ),
        comm=CommCoeffs(
            bytes_per_token=bpt,
            ms_per_mib=round(ms_per_mib, 8),
            fixed_ms=round(setup.collectives_per_layer * setup.collective_latency_ms * model.num_layers, 6),
        ),
        bucket_tokens=bucket,
        microbatch_ms=round(microbatch_ms, 6),
        extra=extra,
    )

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
    kv_bytes_per_token = 2 (K, V) * layers * kv_heads_per_tp_rank * head_dim * 2 bytes (bf16)
             (what an all-gather microbatch keeps of every gathered token, forward to backward:
             worker/dacp.py; the memory rule charges r = kv / activation bytes per gathered token)
    With ``paper_bucket`` and a model of the shape Skrull measured (section 5.1: Qwen2.5-0.5B, 7B), the
    bucket is the paper's, scaled by free memory, and ``activation_bytes_per_token`` is what that bucket
    implies (free memory / bucket), so r prices the gathered K/V against the measured activations.
    Which rule gave the bucket is recorded as ``memory.bucket_rule`` (``derived`` or ``paper``). Nothing
    is looked up by the model's name: the paper's buckets and the training setups are matched by shape.

Topology (``topology``; solver/profiles/gpus.py ``topology_for``): published NVLink and InfiniBand figures per
GPU, or the user's own (``gpus_per_node``, ``intra_gbps``, ``inter_gbps``). Overlap (``overlap``): what
worker/dacp.py overlaps, each collective with the local attention call of the same layer, and Ulysses'
second all-to-all in each direction exposed (``ulysses_exposed`` = 0.5 of its volume).

Per-microbatch overhead: ``framework_ms`` (launches, data movement, hooks) plus the part of ZeRO-2's
per-micro-step gradient reduction that backward does not hide:
    microbatch_ms = framework_ms + (1 - overlap) * 2P bytes / dp_bandwidth

Tensor parallelism of degree t (``TrainingSetup.tp``; Megatron-style with sequence parallelism: attention
heads, MLP columns and the vocabulary split over t GPUs, norm and dropout activations split along the
sequence; Shoeybi et al. 2019, "Megatron-LM", sec. 3; Korthikanti et al. 2022, sec. 4.2). The planner
still sees one GPU per DP x CP slot, so every coefficient is what one GPU of a TP group does for a token:
    kv_t = ceil(h_kv_heads / t) * head_dim   (K/V heads per rank; replicated when h_kv_heads < t)
    flops_per_token    = 3 * layers * ((4*h*q + 16*h^2) / t + 4*h*kv_t) + tp_comm_flops
    flops_per_token_sq = 3 * layers * 4*q / t
    bytes_per_token    = layers * 2 * kv_t * 2 B * 2
    static             = the ZeRO terms above for P_t = P_norms + (P - P_norms - P_kv) / t + P_kv(kv_t)
                         parameters per rank (norm weights replicated, K/V projections per kv_t)
    alpha              = (layers * (8*h + 4*q + 8*I) + 6*V) / t + layers * 4*kv_t
                         (Korthikanti eq. for t-way TP with sequence parallelism: sbh(34 + 5as/h)/t per layer,
                         every activation split over t; the logits split over the vocabulary)
    microbatch_ms      = framework_ms + (1 - overlap) * 2*P_t bytes / dp_bandwidth
TP communication (Korthikanti sec. 4.2.2: four all-reduces per layer in forward plus backward, or with
sequence parallelism four all-gathers and four reduce-scatters of the same volume) of h * 2 B per token,
over the node's link at the CP bus bandwidth (``GpuSpec.cp_bus_bandwidth_gbs``; TP stays in a node):
    tp_ms_per_token = layers * 4 * 2*(t-1)/t * h * 2 B / tp_bus_bandwidth
not overlapped with compute, is folded into the compute coefficient as the FLOPs that take as long at
the profile's rate, ``tp_comm_flops = tp_ms_per_token * 1e12 / ms_per_tflop``, so ``T_comp`` charges it
per token; each collective's latency goes into ``compute.fixed_ms`` (``layers * 8 * latency``). With
t = 1 every formula is the one above and the profile is unchanged.

Every constant below carries its source; what is assumed says so.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from skrull.solver.errors import RequestError
from skrull.solver.profile import (
    GATHERED_KV_KEY_PREFIXES,
    CommCoeffs,
    ComputeCoeffs,
    HeadCounts,
    Overlap,
    Profile,
    Topology,
)
from skrull.solver.profiles.gpus import GPUS as GPUS  # re-exported: callers take models and GPUs from here
from skrull.solver.profiles.gpus import GpuSpec as GpuSpec
from skrull.solver.profiles.gpus import topology_for


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
    #: Tensor-parallel degree (Megatron-style, with sequence parallelism); 1: no tensor parallelism.
    tp: int = 1


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
#: to leave room for activations on 80 GB (ZeRO-2 at DP=4 keeps 72 GB of static state per GPU). Matched by
#: the model's shape (``setup_of``), never by its name.
SETUPS: dict[str, TrainingSetup] = {"llama2-13b": TrainingSetup(dp=8, zero_stage=3)}


def _shape(model: ModelConfig) -> tuple[object, ...]:
    """Everything of a model but its name and source: what the derivation reads."""
    return tuple(getattr(model, f.name) for f in dataclasses.fields(model) if f.name not in ("name", "source"))


def builtin_of(model: ModelConfig) -> str | None:
    """The built-in model (``MODELS``) of exactly this shape, whatever the model is called; None if none."""
    shape = _shape(model)
    return next((name for name, known in MODELS.items() if _shape(known) == shape), None)


def setup_of(model: ModelConfig) -> TrainingSetup:
    """The default training setup for a model of this shape (``SETUPS``; Skrull's section 5.1 otherwise)."""
    known = builtin_of(model)
    return SETUPS.get(known, TrainingSetup()) if known is not None else TrainingSetup()


#: Buckets Skrull measured (section 5.1: "BucketSize 26K for Qwen2.5-0.5B and 13K for Qwen2.5-7B"), on
#: 80 GB H100s with the default setup. They calibrate that model's activation bytes per token
#: (free memory on the H100 / measured bucket), which then prices the free memory of any other GPU;
#: other models and setups use the derivation alone.
PAPER_BUCKET_TOKENS: dict[str, int] = {"qwen2.5-0.5b": 26_000, "qwen2.5-7b": 13_000}
PAPER_GPU = "h100-80g"


#: Tensor-parallel all-reduces per layer in forward plus backward (Korthikanti et al. 2022, sec. 4.2.2:
#: two forward, after attention and after the MLP, and their two conjugates backward); with sequence
#: parallelism each is a reduce-scatter plus an all-gather of the same total volume.
TP_ALLREDUCES_PER_LAYER = 4
#: Collectives, and so launch latencies, per layer with sequence parallelism: 4 all-gathers + 4 reduce-scatters.
TP_COLLECTIVES_PER_LAYER = 8


def check_tp(model: ModelConfig, tp: int) -> None:
    """A TP degree splits whole attention heads and whole MLP columns (Megatron's column-parallel layers
    divide their output dimension exactly), so ``tp`` must divide both; K/V heads may be replicated."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise RequestError("--tp", tp, "must be an integer >= 1")
    if model.num_heads % tp:
        raise RequestError("--tp", tp, f"must divide {model.name}'s {model.num_heads} attention heads")
    if model.intermediate_size % tp:
        raise RequestError("--tp", tp, f"must divide {model.name}'s MLP width {model.intermediate_size}")


def kv_heads_per_tp_rank(model: ModelConfig, tp: int = 1) -> int:
    """``ceil(num_kv_heads / tp)``: each rank holds its share of the K/V heads, and one whole head where
    there are fewer K/V heads than ranks (each K/V head is then replicated on ``tp / num_kv_heads`` ranks,
    as Megatron does for grouped-query attention); with an uneven split the busiest rank is charged."""
    return -(-model.num_kv_heads // tp)


def kv_hidden_per_tp_rank(model: ModelConfig, tp: int = 1) -> int:
    """Width of one rank's K (or V): ``kv_heads_per_tp_rank * head_dim`` (``kv_hidden_size`` at tp = 1)."""
    return kv_heads_per_tp_rank(model, tp) * model.head_dim


def params_per_tp_rank(model: ModelConfig, tp: int = 1) -> float:
    """Parameters one rank of a TP group holds: the RMSNorm weights (``2*h`` per layer and the final ``h``)
    replicated, the K/V projections (and biases) at the rank's ``kv_t`` width, every other matrix (Q, O,
    the MLP, the vocabulary-parallel embeddings and LM head) split ``1/tp``; ``num_params`` at tp = 1."""
    h, kv, kv_t = model.hidden_size, model.kv_hidden_size, kv_hidden_per_tp_rank(model, tp)
    norms = 2 * h * model.num_layers + h
    per_kv_width = model.num_layers * 2 * (h + (1 if model.qkv_bias else 0))  # K and V weights (+ biases)
    split = model.num_params - norms - per_kv_width * kv
    return float(split + (norms + per_kv_width * kv_t) * tp) / tp


def flops_coefficients(model: ModelConfig, tp: int = 1) -> tuple[float, float]:
    """(flops_per_token, flops_per_token_sq): Skrull eq. 13 x layers x 3, for one rank of a TP group.

    Eq. 13's ``20*h^2`` is the query and output projections (``4*h^2``) plus the MLP (``16*h^2``), and its
    ``4*h*S^2`` is the two attention matmuls; with queries of width ``q = heads * head_dim != h`` (Gemma)
    those terms become ``4*h*q`` and ``4*q*S^2``. For every model with ``q == h`` this is eq. 13 exactly.
    Under tensor parallelism every term is split ``1/tp`` (heads and MLP columns) except the K/V
    projections, at the rank's width ``kv_t`` (replicated heads are computed on every rank holding them).
    The TP communication is not in these FLOPs (``tp_comm_ms_per_token``).
    """
    h, q, kv_t = model.hidden_size, model.q_hidden_size, kv_hidden_per_tp_rank(model, tp)
    per_token = 3 * model.num_layers * (4 * h * q + 16 * h * h + 4 * h * kv_t * tp)
    per_token_sq = 3 * model.num_layers * 4 * q
    return float(per_token) / tp, float(per_token_sq) / tp


def comm_bytes_per_token(model: ModelConfig, *, bytes_per_value: int = 2, tp: int = 1) -> float:
    """K and V gathered forward and their gradients reduced backward, every layer: each rank of a TP group
    exchanges its own ``kv_t`` heads with its CP peers (the same TP rank of the other CP slots)."""
    return float(model.num_layers * 2 * kv_hidden_per_tp_rank(model, tp) * bytes_per_value * 2)


#: Ulysses all-to-alls per layer: Q/K/V in and the attention output back, forward, and both in backward.
A2A_COLLECTIVES_PER_LAYER = 4


def a2a_bytes_per_token(model: ModelConfig, *, bytes_per_value: int = 2, tp: int = 1) -> float:
    """Ulysses (DeepSpeed-Ulysses, XTuner): per token and layer, Q, K and V go out through an all-to-all
    before attention and the output comes back through another, forward, and their gradients backward:
    ``layers * (2*q_hidden/tp + 2*kv_hidden_t) * 2 B * 2``. The cost model charges it for ``T/N`` tokens
    (each GPU moves its own shard). A group whose size N does not divide the K/V heads sends ``lcm(kv, N) /
    kv`` copies of each (worker/dacp.py ``ulysses_kv_copies``); the cost model adds the copies from
    ``a2a_kv_bytes_per_token``, the K/V part of this."""
    q_hidden = model.q_hidden_size // tp
    return float(model.num_layers * (2 * q_hidden + 2 * kv_hidden_per_tp_rank(model, tp)) * bytes_per_value * 2)


def a2a_kv_bytes_per_token(model: ModelConfig, *, bytes_per_value: int = 2, tp: int = 1) -> float:
    """The K/V part of ``a2a_bytes_per_token``, ``layers * 2 * kv_hidden_t * 2 B * 2``: what each extra copy
    of the K/V heads adds on a group wider than them (``comm_a2a.kv_bytes_per_token``)."""
    return float(model.num_layers * 2 * kv_hidden_per_tp_rank(model, tp) * bytes_per_value * 2)


def tp_comm_bytes_per_token(model: ModelConfig, tp: int, *, bytes_per_value: int = 2) -> float:
    """Bus bytes one rank moves per token for tensor parallelism: ``TP_ALLREDUCES_PER_LAYER`` all-reduces
    of ``h`` values per token per layer, each moving ``2*(t-1)/t`` of its size over a rank's link (ring
    all-reduce, or its reduce-scatter plus all-gather halves; the nccl-tests "bus bandwidth" convention)."""
    size = model.hidden_size * bytes_per_value
    return float(model.num_layers * TP_ALLREDUCES_PER_LAYER * 2 * (tp - 1) * size) / tp


def tp_comm_ms_per_token(model: ModelConfig, gpu: GpuSpec, tp: int) -> float:
    """``tp_comm_bytes_per_token / bus bandwidth`` in ms, at ``gpu.cp_bus_bandwidth_gbs``: a TP group sits
    inside one node, on the same NVLink (or PCIe) the CP all-gathers use, at the same achieved fraction."""
    return tp_comm_bytes_per_token(model, tp) / (gpu.cp_bus_bandwidth_gbs * 1e9) * 1e3


def static_memory_bytes(model: ModelConfig, setup: TrainingSetup) -> float:
    """Weights, gradients and Adam states per GPU (ZeRO over ``dp``) of one TP rank's ``params_per_tp_rank``."""
    p = params_per_tp_rank(model, setup.tp)
    weights = 2.0 * p / (setup.dp if setup.zero_stage >= 3 else 1)
    grads = 2.0 * p / (setup.dp if setup.zero_stage >= 2 else 1)
    optimizer = 12.0 * p / (setup.dp if setup.zero_stage >= 1 else 1)
    return weights + grads + optimizer


def kv_bytes_per_token(model: ModelConfig, tp: int = 1, *, bytes_per_value: int = 2) -> float:
    """K and V of one token over every layer on one GPU of a TP group: ``2 * layers * kv_heads_per_tp_rank
    * head_dim * 2 B`` (bf16). An all-gather microbatch keeps this for every gathered token of the group's
    sharded sequences from forward to backward (worker/dacp.py; ``memory.kv_bytes_per_token``)."""
    return float(2 * model.num_layers * kv_hidden_per_tp_rank(model, tp) * bytes_per_value)


#: What worker/dacp.py overlaps (the profile's ``overlap`` section; solver/cost.py prices it).
OVERLAP: dict[str, Any] = {
    "with": "local_attention",
    "ulysses_exposed": 0.5,
    "source": "worker/dacp.py: each layer's K/V all-gather (and Ulysses' first all-to-all) runs while the same "
    "layer's local-sequence attention call computes, not across the rest of the local compute; Ulysses' second "
    "all-to-all in each direction (the output back forward, dQ/dK/dV back backward: half the volume) waits",
}


def activation_bytes_per_token(model: ModelConfig, tp: int = 1) -> float:
    """``layers * (8*h + 4*q + 4*h_kv + 8*I) + 6*V``: the module docstring's ``12*h`` with the queries and
    attention output (``4*h`` of it) counted at their own width ``q``.

    Under TP with sequence parallelism (Korthikanti et al. 2022, sec. 4.2.2, table 2: ``sbh(34 + 5as/h)/t``
    per layer) each rank holds ``1/tp`` of every term: the norm inputs and outputs (``8*h``) split along
    the sequence, Q and the attention output (``4*q``) and the MLP's ``8*I`` split by heads and columns,
    the logits (``6*V``) by the vocabulary; K and V (``4*h_kv``) are held at the rank's ``kv_t`` width.
    """
    h, q, kv_t, i = model.hidden_size, model.q_hidden_size, kv_hidden_per_tp_rank(model, tp), model.intermediate_size
    return float(model.num_layers * (8 * h + 4 * q + 4 * kv_t * tp + 8 * i) + 6 * model.vocab_size) / tp


def derived_bucket_tokens(model: ModelConfig, gpu: GpuSpec, setup: TrainingSetup) -> int:
    free = free_memory_bytes(model, gpu, setup)
    if free <= 0:
        return 0
    return int(free // activation_bytes_per_token(model, setup.tp))


def free_memory_bytes(model: ModelConfig, gpu: GpuSpec, setup: TrainingSetup) -> float:
    """What activations may use: the GPU's memory less the reserve and the static training state."""
    return gpu.memory_bytes * (1.0 - setup.reserve_fraction) - static_memory_bytes(model, setup)


def calibrated_bucket_tokens(model: ModelConfig, gpu: GpuSpec, setup: TrainingSetup, paper_tokens: int) -> int:
    """``paper_tokens * free(gpu) / free(H100 80 GB)``: the measured bucket scaled by free memory, so that
    the measured activation bytes per token (not the formula's) price every GPU; exactly the paper's
    value on the GPU it was measured on.

    Under TP the measured bytes per token (``free(H100, tp = 1) / paper_tokens``) are scaled by the
    derivation's share ``activation_bytes_per_token(tp) / activation_bytes_per_token(1)`` (``1/tp`` but
    for replicated K/V heads) and divide this rank's free memory.
    """
    free = free_memory_bytes(model, gpu, setup)
    reference = free_memory_bytes(model, GPUS[PAPER_GPU], dataclasses.replace(setup, tp=1))
    if free <= 0:
        return 0
    if setup.tp > 1:
        share = activation_bytes_per_token(model, setup.tp) / activation_bytes_per_token(model)
        return int(free // (reference / paper_tokens * share))
    if gpu.memory_bytes == GPUS[PAPER_GPU].memory_bytes:
        return paper_tokens
    return int(paper_tokens * free / reference)


def paper_bucket_of(model: ModelConfig, setup: TrainingSetup) -> int | None:
    """Skrull's measured bucket for a model of this shape under the default setup (any TP degree), else None."""
    known = builtin_of(model)
    if known is None or dataclasses.replace(setup, tp=1) != TrainingSetup():
        return None
    return PAPER_BUCKET_TOKENS.get(known)


def derive_profile(
    model: ModelConfig,
    gpu: GpuSpec,
    setup: TrainingSetup | None = None,
    *,
    paper_bucket: bool = False,
    topology: Topology | None = None,
) -> Profile:
    """A profile with every number's source; ``estimated: true`` until ``skrull profile`` measures it.

    The bucket is the derivation's (module docstring) from the model's shape and the training setup; with
    ``paper_bucket`` it is Skrull's measured value where the paper gives one for a model of this shape
    (Qwen2.5-0.5B, 7B with the default setup, any TP degree), scaled by free memory to other GPUs
    (``calibrated_bucket_tokens``); ``memory.bucket_rule`` says which, and both values are recorded. The
    profile carries ``memory.kv_bytes_per_token`` and ``activation_bytes_per_token`` (the gathered-K/V
    rule) with ``memory.gathered_kv: key_prefixes`` (what worker/dacp.py keeps: each own piece's key
    prefix, charged ``(2N+1)/(2N)`` of the sharded tokens; solver/cost.py), ``topology`` (``topology``,
    default the GPU's published figures: solver/profiles/gpus.py ``topology_for``) and ``overlap`` (``OVERLAP``).
    With ``setup.tp > 1`` the profile prices one rank of a TP group (module docstring), is named
    ``<gpu>/<model>-tp<t>`` and records ``setup.tp`` and a ``tensor_parallel`` block; with ``tp = 1``
    neither is written and the profile is the plain one.
    """
    setup = setup or setup_of(model)
    tp = setup.tp
    check_tp(model, tp)
    fpt, fpt_sq = flops_coefficients(model, tp)
    bpt = comm_bytes_per_token(model, tp=tp)
    derived = derived_bucket_tokens(model, gpu, setup)
    paper = paper_bucket_of(model, setup)
    use_paper = paper_bucket and paper is not None
    bucket = calibrated_bucket_tokens(model, gpu, setup, paper) if use_paper and paper is not None else derived
    activation = activation_bytes_per_token(model, tp)
    if use_paper and bucket > 0:  # what the measured bucket implies of each token (module docstring)
        activation = round(free_memory_bytes(model, gpu, setup) / bucket, 3)
    topology = topology if topology is not None else topology_for(gpu)
    ms_per_tflop = round(1e3 / (gpu.peak_bf16_tflops * setup.mfu), 6)
    ms_per_mib = 2**20 / (gpu.cp_bus_bandwidth_gbs * 1e9) * 1e3
    params = params_per_tp_rank(model, tp)
    grad_ms = 2.0 * params / (gpu.dp_bandwidth_gbs * 1e9) * 1e3
    microbatch_ms = setup.framework_ms + (1.0 - setup.grad_reduce_overlap) * grad_ms
    fixed_ms = setup.compute_fixed_ms_per_layer * model.num_layers
    tp_ms = tp_comm_ms_per_token(model, gpu, tp)
    tp_flops = tp_ms * 1e12 / ms_per_tflop
    tp_fixed_ms = TP_COLLECTIVES_PER_LAYER * setup.collective_latency_ms * model.num_layers
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
            "source": "Skrull section 5.1 (DeepSpeed ZeRO-2, DP=4) unless noted in solver/profiles/derive.py "
            "SETUPS; MFU 0.30 and 10% reserve assumed",
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
        "heads": {
            "source": "the config's num_attention_heads and num_key_value_heads, per TP rank: Ulysses splits "
            "the attention heads over the group (N must divide them; K/V heads replicated to lcm(kv, N) where N "
            "does not divide them)",
        },
        "comm_a2a": {
            "source": "bytes: layers * (2 * q_hidden + 2 * kv_hidden) * 2 B * 2 (Q/K/V all-to-all in, output "
            "all-to-all back; fwd + bwd), charged for T/N tokens; kv_bytes_per_token: its K/V part, "
            "charged again per extra copy where the group size does not divide the kv heads (lcm(kv, N) / kv "
            f"copies); ms_per_mib from {gpu.cp_bus_bandwidth_gbs} GB/s bus bandwidth (the all-gather's, "
            f"assumed); fixed_ms = {A2A_COLLECTIVES_PER_LAYER} collectives x {setup.collective_latency_ms} ms "
            "per layer (assumed)",
        },
        "memory": {
            "bucket_rule": "paper" if use_paper else "derived",
            "derived_bucket_tokens": derived,
            "paper_bucket_tokens": paper,
            "static_bytes": static_memory_bytes(model, setup),
            "activation_bytes_per_token": activation,
            "kv_bytes_per_token": kv_bytes_per_token(model, tp),
            "gathered_kv": GATHERED_KV_KEY_PREFIXES,
            "source": (
                "bucket_tokens: Skrull section 5.1's measured bucket for this model shape, scaled by free memory "
                "off the 80 GB H100 (bucket_rule paper, asked with --paper-bucket); activation_bytes_per_token: "
                "free memory / that bucket"
                if use_paper
                else "bucket_tokens: derived from the model's shape and the training setup (bucket_rule derived; "
                "solver/profiles/derive.py); activation_bytes_per_token: the derivation's per-token activations"
            )
            + "; kv_bytes_per_token: 2 (K, V) x layers x K/V heads per TP rank x head_dim x 2 B; gathered_kv: "
            "key_prefixes, the worker (worker/dacp.py, all-gather) keeps for each of its own pieces of a sharded "
            "sequence the packed key prefix [0, end) until backward (the varlen kernel saves it): (2N+1)/(2N) x "
            "the sharded tokens per GPU under the zigzag split (tests/worker/test_gathered_kv_memory.py)",
        },
        "overlap": dict(OVERLAP),
        "microbatch_source": f"{setup.framework_ms} ms framework (assumed) + {1 - setup.grad_reduce_overlap:.2f} x "
        f"ZeRO-2 gradient reduction of 2P bytes at {gpu.dp_bandwidth_gbs} GB/s",
    }
    name = f"{gpu.name}/{model.name}"
    if tp > 1:
        name = f"{name}-tp{tp}"
        _describe_tp(extra, model, gpu, setup, flops=(fpt, tp_flops), tp_ms=tp_ms, tp_fixed_ms=tp_fixed_ms)
        fpt += tp_flops
        fixed_ms += tp_fixed_ms
    return Profile(
        name=name,
        compute=ComputeCoeffs(
            flops_per_token=fpt,
            flops_per_token_sq=fpt_sq,
            ms_per_tflop=ms_per_tflop,
            fixed_ms=round(fixed_ms, 6),
        ),
        comm=CommCoeffs(
            bytes_per_token=bpt,
            ms_per_mib=round(ms_per_mib, 8),
            fixed_ms=round(setup.collectives_per_layer * setup.collective_latency_ms * model.num_layers, 6),
        ),
        bucket_tokens=bucket,
        microbatch_ms=round(microbatch_ms, 6),
        heads=HeadCounts(attention=model.num_heads // tp, kv=kv_heads_per_tp_rank(model, tp)),
        comm_a2a=CommCoeffs(
            bytes_per_token=a2a_bytes_per_token(model, tp=tp),
            kv_bytes_per_token=a2a_kv_bytes_per_token(model, tp=tp),
            ms_per_mib=round(ms_per_mib, 8),
            fixed_ms=round(A2A_COLLECTIVES_PER_LAYER * setup.collective_latency_ms * model.num_layers, 6),
        ),
        topology=topology,
        activation_bytes_per_token=activation,
        kv_bytes_per_token=extra["memory"]["kv_bytes_per_token"],
        gathered_kv=GATHERED_KV_KEY_PREFIXES,
        overlap=Overlap(scope=OVERLAP["with"], ulysses_exposed=OVERLAP["ulysses_exposed"], source=OVERLAP["source"]),
        extra=extra,
    )


def _describe_tp(
    extra: dict[str, Any],
    model: ModelConfig,
    gpu: GpuSpec,
    setup: TrainingSetup,
    *,
    flops: tuple[float, float],
    tp_ms: float,
    tp_fixed_ms: float,
) -> None:
    """Record the TP degree (``setup.tp``) and what it changed, with sources, in a profile's extra fields."""
    tp = setup.tp
    extra["setup"]["tp"] = tp
    extra["setup"]["source"] += f"; tensor parallelism of degree {tp} with sequence parallelism (given)"
    extra["tensor_parallel"] = {
        "degree": tp,
        "kv_heads_per_rank": kv_heads_per_tp_rank(model, tp),
        "params_per_rank": params_per_tp_rank(model, tp),
        "flops_per_token": flops[0],
        "comm_flops_per_token": flops[1],
        "comm_bytes_per_token": tp_comm_bytes_per_token(model, tp),
        "comm_ms_per_token": tp_ms,
        "comm_fixed_ms": round(tp_fixed_ms, 6),
        "bus_bandwidth_gbs": gpu.cp_bus_bandwidth_gbs,
        "source": (
            f"one rank of a {tp}-way Megatron-style TP group with sequence parallelism (Shoeybi et al. 2019; "
            "Korthikanti et al. 2022, sec. 4.2): FLOPs, K/V bytes, parameters and activations split 1/tp "
            f"(K/V heads: ceil({model.num_kv_heads}/{tp}) per rank, replicated when fewer than tp; norm weights "
            f"replicated); TP traffic {TP_ALLREDUCES_PER_LAYER} all-reduces of hidden * 2 B per token per layer "
            f"(x 2(t-1)/t bus bytes) at the {gpu.cp_bus_bandwidth_gbs} GB/s intra-node bus bandwidth, not "
            "overlapped, folded into compute.flops_per_token as comm_flops_per_token = comm_ms_per_token * 1e12 "
            f"/ ms_per_tflop; {TP_COLLECTIVES_PER_LAYER} collectives x {setup.collective_latency_ms} ms per layer "
            "added to compute.fixed_ms (assumed latency)"
        ),
    }
    extra["compute"]["source"] += (
        f"; one rank's 1/{tp} share plus TP communication and latency (tensor_parallel.source)"
    )
    extra["comm"]["source"] += f"; kv_hidden: this rank's {kv_heads_per_tp_rank(model, tp)} K/V heads"
    extra["microbatch_source"] += f" (P: this rank's {tp}-way TP share, tensor_parallel.params_per_rank)"

"""Measurements on the device: one decoder layer of a model's shape, timed and weighed.

Everything is measured on one decoder layer (RMSNorm, rotary GQA attention, SwiGLU MLP) with the
model's dimensions and random weights, in the training dtype; a microbatch's compute is
``num_layers x`` that layer's forward+backward plus the LM head and its cross-entropy over the same
tokens (``HeadTimer``: in chunks under activation checkpointing, as worker/hf/step.py runs it). The
head is outside Skrull eq. 13 but not free: ``6 * h * vocab`` FLOPs per token (8 with the recompute),
which for Qwen2.5-0.5B is 0.8 GFLOP against the layers' 1.2; the fit's token term absorbs it.
A GPU's part of a microbatch is what worker/layout.py says it holds: its local sequences whole, and
its shard pieces, each attending to its sequence's key prefix (random keys stand in for the gathered
ones: the same kernel work, no collective).

Eager PyTorch costs host time per operator (on the H100 machine of docs/gpu-check: ~50 us per
operator, ~5 ms per decoder layer forward+backward), so packs too small to cover it take about the
same time whatever their size; the fit's ``fixed_ms`` carries that floor. ``build_layer(compile=True)``
times the layer as the fast step runs it (worker/compiling.py), which removes most of that floor; the
profiler compiles by default on CUDA (``skrull profile --compile``).

Times are medians over repeats after warm-up with CUDA events on a GPU, and the fastest repeat with
``perf_counter`` on a CPU. Activation bytes are the bytes autograd saves for backward (unique storages,
counted through ``saved_tensors_hooks``), plus the allocator's peak on a GPU.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from skrull.solver.profiles.derive import MODELS, ModelConfig, flops_coefficients
from skrull.worker.compiling import compile_layers
from skrull.worker.fused_ce import linear_cross_entropy_sum
from skrull.worker.kernels import AttentionKernel
from skrull.worker.layout import MicrobatchLayout
from skrull.worker.model import DecoderLayer
from skrull.worker.profiling.fit import AttentionPoint, ComputeSample, MemorySample

#: A small model for exercising the whole profiler on a CPU (tests, ``--device cpu``); not a real model.
TINY = ModelConfig(
    name="tiny",
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=128,
    vocab_size=256,
    tied_embeddings=True,
    qkv_bias=False,
    source="a small made-up shape for exercising the profiler on a CPU",
)
PROFILE_MODELS: dict[str, ModelConfig] = {**MODELS, TINY.name: TINY}


def repeat_ms(fn: Callable[[], Any], device: torch.device, *, repeats: int) -> list[float]:
    """Milliseconds of each of ``repeats`` calls of ``fn``: CUDA events on a GPU (each call's kernels, the
    host free to run ahead before the call), the host clock on a CPU. Warm-up is the caller's."""
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            torch.cuda.synchronize(device)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(float(start.elapsed_time(end)))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


@dataclass(frozen=True, slots=True, kw_only=True)
class Part:
    """What one GPU computes in one microbatch: whole local sequences and shard pieces ``(start, end)``."""

    local_lengths: tuple[int, ...]
    pieces: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, layout: MicrobatchLayout) -> Part:
        return cls(local_lengths=layout.local_lengths, pieces=tuple((p.start, p.end) for p in layout.pieces))

    @property
    def num_tokens(self) -> int:
        return sum(self.local_lengths) + sum(b - a for a, b in self.pieces)


class Timer:
    """Milliseconds of a callable on ``device`` after warm-up: the median of the repeats on a GPU (CUDA
    events, steady state), the fastest on a CPU (a shared CPU's interference only ever adds time)."""

    def __init__(self, device: torch.device, *, warmup: int = 1, repeats: int = 3) -> None:
        self.device = device
        self.warmup = warmup
        self.repeats = repeats

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def ms(self, fn: Callable[[], Any]) -> float:
        for _ in range(self.warmup):
            fn()
        self._sync()
        times = repeat_ms(fn, self.device, repeats=self.repeats)
        return statistics.median(times) if self.device.type == "cuda" else min(times)


def build_layer(
    model: ModelConfig, *, device: torch.device, dtype: torch.dtype, seed: int = 0, compile: bool = False
) -> DecoderLayer:
    """One decoder layer of ``model``'s shape; with ``compile`` its forward runs compiled as the fast step's
    layers do (worker/compiling.py: dynamic token count, the attention a graph break)."""
    torch.manual_seed(seed)
    layer = DecoderLayer(
        hidden_size=model.hidden_size,
        num_heads=model.num_heads,
        num_kv_heads=model.num_kv_heads,
        head_dim=model.head_dim,
        intermediate_size=model.intermediate_size,
    )
    layer = layer.to(device=device, dtype=dtype)
    if compile:
        compile_layers([layer])
    return layer


class _PartAttention:
    """``attend(q, k, v)`` of one part: its local sequences whole and its pieces against random key prefixes.

    A callable object whose ``__call__`` is a graph break: a compiled layer runs it eagerly and, as it
    guards on the object's type only, parts of any shape reuse one compiled graph."""

    def __init__(
        self,
        kernel: AttentionKernel,
        *,
        n_local: int,
        local: tuple[torch.Tensor, int],
        pieces: tuple[torch.Tensor, torch.Tensor, int, int] | None,
        prefix: tuple[torch.Tensor, torch.Tensor],
    ) -> None:
        self.kernel = kernel
        self.n_local = n_local
        self.local = local
        self.pieces = pieces
        self.prefix = prefix

    @torch.compiler.disable  # type: ignore[untyped-decorator]
    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        outs = []
        n = self.n_local
        if n:
            cu, max_len = self.local
            outs.append(
                self.kernel(
                    q[:n], k[:n], v[:n], cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max_len, max_seqlen_k=max_len
                )
            )
        if self.pieces is not None:
            cu_q, cu_k, max_q, max_k = self.pieces
            outs.append(
                self.kernel(
                    q[n:],
                    self.prefix[0],
                    self.prefix[1],
                    cu_seqlens_q=cu_q,
                    cu_seqlens_k=cu_k,
                    max_seqlen_q=max_q,
                    max_seqlen_k=max_k,
                )
            )
        return torch.cat(outs)


def sequence_flops(model: ModelConfig, lengths: Sequence[int]) -> float:
    """Training FLOPs of whole sequences (Skrull eq. 13 x layers x 3), summed."""
    per_token, per_token_sq = flops_coefficients(model)
    return sum(per_token * s + per_token_sq * s * s for s in lengths)


def _cu(values: Sequence[int], device: torch.device) -> torch.Tensor:
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    return torch.tensor(out, dtype=torch.int32, device=device)


def part_step(
    layer: DecoderLayer,
    part: Part,
    *,
    kernel: AttentionKernel,
    device: torch.device,
    dtype: torch.dtype,
    seed: int = 0,
    depth: int = 1,
    head_weight: torch.Tensor | None = None,
    chunk_tokens: int = 4096,
) -> Callable[[], None]:
    """A closure running the layer forward and backward over ``part`` (inputs built once, up front).

    With ``depth`` the layer runs that many times in sequence (a model of ``depth`` layers: the same
    kernels, launches and saved activations, one layer's weights); with ``head_weight`` the LM head and
    its summed cross-entropy follow, fused in chunks as the step runs it, and one backward covers it all:
    one whole training microbatch, what a calibrated profile is fitted on (worker/profiling/check.py).
    """
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    hidden = layer.attn.q_proj.in_features
    kv_heads, head_dim = layer.attn.num_kv_heads, layer.attn.head_dim
    gen = torch.Generator().manual_seed(seed)
    n_local = sum(part.local_lengths)
    x = torch.randn(part.num_tokens, hidden, generator=gen).to(device=device, dtype=dtype).requires_grad_(True)
    pos = torch.tensor(
        [t for n in part.local_lengths for t in range(n)] + [t for a, b in part.pieces for t in range(a, b)],
        dtype=torch.long,
        device=device,
    )
    key_tokens = sum(b for _, b in part.pieces)
    prefix_k = torch.randn(key_tokens, kv_heads, head_dim, generator=gen).to(device=device, dtype=dtype)
    prefix_v = torch.randn(key_tokens, kv_heads, head_dim, generator=gen).to(device=device, dtype=dtype)
    prefix_k.requires_grad_(True)
    prefix_v.requires_grad_(True)
    local_cu = _cu(part.local_lengths, device)
    piece_cu_q = _cu([b - a for a, b in part.pieces], device)
    piece_cu_k = _cu([b for _, b in part.pieces], device)
    max_local = max(part.local_lengths, default=0)
    max_q = max((b - a for a, b in part.pieces), default=0)
    max_k = max((b for _, b in part.pieces), default=0)
    grad_out = torch.randn(part.num_tokens, hidden, generator=gen).to(device=device, dtype=dtype)

    attend = _PartAttention(
        kernel,
        n_local=n_local,
        local=(local_cu, max_local),
        pieces=(piece_cu_q, piece_cu_k, max_q, max_k) if part.pieces else None,
        prefix=(prefix_k, prefix_v),
    )

    labels = (
        torch.randint(0, head_weight.shape[0], (part.num_tokens,), generator=gen).to(device)
        if head_weight is not None
        else None
    )

    def step() -> None:
        out = x
        for _ in range(depth):
            out = layer(out, pos, attend)
        if head_weight is None or labels is None:
            torch.autograd.backward(out, grad_out)
        else:
            torch.autograd.backward(linear_cross_entropy_sum(out, head_weight, labels, chunk_tokens=chunk_tokens))
            head_weight.grad = None
        x.grad = None
        prefix_k.grad = prefix_v.grad = None
        layer.zero_grad(set_to_none=True)

    return step


class HeadTimer:
    """Milliseconds of the LM head and its summed cross-entropy, forward and backward, for ``tokens`` rows.

    The head and its loss run fused, ``chunk_tokens`` rows at a time (worker/fused_ce.py), in the
    training dtype with the loss in float32, as ``worker.hf.step.causal_lm_loss`` does with
    ``loss_chunk_tokens``; one timing per token count.
    """

    def __init__(
        self, model: ModelConfig, *, timer: Timer, dtype: torch.dtype, chunk_tokens: int = 4096, seed: int = 0
    ) -> None:
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
        gen = torch.Generator().manual_seed(seed)
        self._weight: torch.Tensor = (
            (torch.randn(model.vocab_size, model.hidden_size, generator=gen) * model.hidden_size**-0.5)
            .to(device=timer.device, dtype=dtype)
            .requires_grad_(True)
        )
        self._model = model
        self._timer = timer
        self._dtype = dtype
        self._chunk = chunk_tokens
        self._cache: dict[int, float] = {}

    def _step(self, tokens: int) -> Callable[[], None]:
        device = self._timer.device
        gen = torch.Generator().manual_seed(tokens)
        x = torch.randn(tokens, self._model.hidden_size, generator=gen).to(device=device, dtype=self._dtype)
        x.requires_grad_(True)
        labels = torch.randint(0, self._model.vocab_size, (tokens,), generator=gen).to(device)
        weight = self._weight

        def step() -> None:
            total = linear_cross_entropy_sum(x, weight, labels, chunk_tokens=self._chunk)
            torch.autograd.backward(total)
            x.grad = None
            weight.grad = None

        return step

    @property
    def weight(self) -> torch.Tensor:
        """The head's weight (vocabulary x hidden), in the training dtype."""
        return self._weight

    @property
    def chunk_tokens(self) -> int:
        return self._chunk

    def __call__(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        if tokens not in self._cache:
            self._cache[tokens] = self._timer.ms(self._step(tokens))
        return self._cache[tokens]


def measure_parts(
    layer: DecoderLayer,
    parts: Sequence[Part],
    *,
    num_layers: int,
    kernel: AttentionKernel,
    timer: Timer,
    dtype: torch.dtype,
    head: Callable[[int], float] | None = None,
) -> list[float]:
    """Milliseconds of each part on the whole model (``num_layers`` x one layer, plus ``head`` of the
    part's tokens when given); equal parts timed once."""
    cache: dict[Part, float] = {}
    out = []
    for part in parts:
        if part.num_tokens == 0:
            out.append(0.0)
            continue
        if part not in cache:
            step = part_step(layer, part, kernel=kernel, device=timer.device, dtype=dtype)
            cache[part] = num_layers * timer.ms(step) + (head(part.num_tokens) if head is not None else 0.0)
        out.append(cache[part])
    return out


def measure_microbatches(
    layer: DecoderLayer,
    parts: Sequence[Part],
    *,
    num_layers: int,
    kernel: AttentionKernel,
    timer: Timer,
    dtype: torch.dtype,
    head: HeadTimer | None = None,
) -> list[float]:
    """Milliseconds of each part run as one training microbatch (``part_step`` with ``depth=num_layers``
    and ``head``'s weight): host time between the layers' launches counts, as it does in a step, where
    ``measure_parts`` sums separately timed layers; equal parts timed once."""
    cache: dict[Part, float] = {}
    out = []
    for part in parts:
        if part.num_tokens == 0:
            out.append(0.0)
            continue
        if part not in cache:
            step = part_step(
                layer, part, kernel=kernel, device=timer.device, dtype=dtype, depth=num_layers,
                head_weight=head.weight if head is not None else None,
                chunk_tokens=head.chunk_tokens if head is not None else 4096,
            )  # fmt: skip
            cache[part] = timer.ms(step)
        out.append(cache[part])
    return out


def measure_compute(
    model: ModelConfig,
    layer: DecoderLayer,
    packs: Sequence[Sequence[int]],
    *,
    kernel: AttentionKernel,
    timer: Timer,
    dtype: torch.dtype,
    head: Callable[[int], float] | None = None,
) -> list[ComputeSample]:
    """One sample per pack of whole sequences: its FLOPs and the model's forward+backward ms."""
    parts = [Part(local_lengths=tuple(p)) for p in packs]
    times = measure_parts(layer, parts, num_layers=model.num_layers, kernel=kernel, timer=timer, dtype=dtype, head=head)
    return [
        ComputeSample(lengths=tuple(p), flops=sequence_flops(model, p), ms=ms)
        for p, ms in zip(packs, times, strict=True)
    ]


def _attention_step(
    model: ModelConfig, s: int, *, kernel: AttentionKernel, device: torch.device, dtype: torch.dtype
) -> Callable[[], None]:
    gen = torch.Generator().manual_seed(s)
    shape_q = (s, model.num_heads, model.head_dim)
    shape_kv = (s, model.num_kv_heads, model.head_dim)
    q = torch.randn(*shape_q, generator=gen).to(device=device, dtype=dtype).requires_grad_(True)
    k = torch.randn(*shape_kv, generator=gen).to(device=device, dtype=dtype).requires_grad_(True)
    v = torch.randn(*shape_kv, generator=gen).to(device=device, dtype=dtype).requires_grad_(True)
    cu = _cu([s], device)
    grad = torch.randn(*shape_q, generator=gen).to(device=device, dtype=dtype)

    def step() -> None:
        out = kernel(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=s, max_seqlen_k=s)
        torch.autograd.backward(out, grad)
        q.grad = k.grad = v.grad = None

    return step


def measure_attention(
    model: ModelConfig,
    query_lengths: Sequence[int],
    *,
    kernel: AttentionKernel,
    timer: Timer,
    dtype: torch.dtype,
) -> list[AttentionPoint]:
    """Causal attention alone, forward+backward, one sequence per length; FLOPs = 3 * 4*h*S^2 (eq. 13)."""
    return [
        AttentionPoint(
            query_tokens=s,
            ms=timer.ms(_attention_step(model, s, kernel=kernel, device=timer.device, dtype=dtype)),
            flops=3.0 * 4 * model.hidden_size * s * s,
        )
        for s in query_lengths
    ]


def _storage_key(t: torch.Tensor) -> tuple[int, int]:
    return (t.untyped_storage().data_ptr(), t.device.index or 0)


def saved_activation_bytes(
    layer: DecoderLayer, tokens: int, *, kernel: AttentionKernel, device: torch.device, dtype: torch.dtype
) -> MemorySample:
    """Bytes ``layer`` keeps for backward over one sequence of ``tokens`` tokens (unique storages, less
    the input and the weights), and the CUDA allocator's peak growth during the forward on a GPU."""
    hidden = layer.attn.q_proj.in_features
    seen: dict[tuple[int, int], int] = {}

    def pack_hook(t: torch.Tensor) -> torch.Tensor:
        seen[_storage_key(t)] = t.untyped_storage().nbytes()
        return t

    x = torch.randn(tokens, hidden).to(device=device, dtype=dtype).requires_grad_(True)
    pos = torch.arange(tokens, device=device)
    cu = _cu([tokens], device)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return kernel(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=tokens, max_seqlen_k=tokens)

    peak = None
    base = 0
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    with torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda t: t):
        out = layer(x, pos, attend)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        peak = float(torch.cuda.max_memory_allocated(device) - base)
    for t in (x, *layer.parameters()):
        seen.pop(_storage_key(t), None)
    del out
    return MemorySample(tokens=tokens, saved_bytes=float(sum(seen.values())), peak_bytes=peak)


def measure_memory(
    layer: DecoderLayer,
    token_counts: Sequence[int],
    *,
    kernel: AttentionKernel,
    device: torch.device,
    dtype: torch.dtype,
) -> list[MemorySample]:
    """``saved_activation_bytes`` at each token count.

    With a flash-style kernel (flash-attn, PyTorch varlen) attention saves O(S) bytes and the fit is
    linear; the CPU reference and SDPA's math path keep the O(S^2) probabilities, which the samples show.
    """
    return [saved_activation_bytes(layer, t, kernel=kernel, device=device, dtype=dtype) for t in token_counts]

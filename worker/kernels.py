"""One attention adapter over packed variable-length sequences, whatever is installed.

All kernels take the flash-attention varlen spelling: ``q`` is ``[total_q, H, D]``, ``k`` and ``v`` are
``[total_k, H_kv, D]`` (grouped-query attention when ``H_kv < H``: query head ``h`` uses key/value head
``h // (H / H_kv)``), ``cu_seqlens_q`` / ``cu_seqlens_k`` are int32 offsets of the segments, and segment
``i`` of the queries attends only to segment ``i`` of the keys. Causal masking is aligned to the bottom
right, flash-attention's convention: query ``i`` of a segment with ``q_len`` queries and ``k_len`` keys
sees keys ``0 .. i + k_len - q_len``. That is what lets a shard piece ``[a, b)`` attend to the key prefix
``[0, b)`` of its sequence with the sequence's own causal mask (see worker/layout.py).

Two attention features of some model families are part of the call, so that every backend computes them
on every path (local sequences, shard pieces, Ulysses' whole sequences):

- ``softcap`` (Gemma 2's ``attn_logit_softcapping``): scores become ``softcap * tanh(scores / softcap)``
  before the mask and the softmax. flash-attn takes it as ``softcap``; ``sdpa`` and PyTorch's varlen
  kernel have no such argument, so with a softcap they compute the scores explicitly (the reference's way);
- ``window`` (``sliding_window``, Hugging Face's meaning): a query at position ``p`` sees keys ``p - window <
  j <= p``, i.e. the ``window`` keys ending at itself; with bottom-right alignment ``p`` is the query's
  position in the key segment. flash-attn spells it ``window_size=(window - 1, 0)``.

Backends, in order of preference (``select_kernel``; ``choose_kernel`` also says why):

- ``flash-attn-4``: ``flash_attn.cute.flash_attn_varlen_func`` (the ``flash-attn-4`` wheel, CuTe DSL, no
  compiler needed to install) on Hopper and Blackwell (compute capability 9.x and 10.x), fp16/bf16;
- ``flash-attn``: flash-attn 2's ``flash_attn.flash_attn_varlen_func`` when installed (CUDA, fp16/bf16);
- ``torch-varlen``: PyTorch's own ``torch.nn.attention.varlen.varlen_attn`` (CUDA, fp16/bf16);
- ``sdpa``: ``scaled_dot_product_attention`` per segment (any device and dtype; GPU fallback);
- ``reference``: the softmax written out, in float32, query block by query block (CPU default; the
  yardstick the others are tested against).

All are differentiable through autograd (the first three through their own backward kernels).

A CUDA backend is chosen only after a trial call: two segments (one whole, one a shard piece whose
queries see a longer key prefix), forward and backward, compared with the float32 reference. A wheel
that imports but fails on this GPU or this driver, or masks from the top left instead of the bottom
right, is passed over with its reason, and ``KernelChoice.describe()`` is the one line that says
which backend runs and why the better ones do not.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from skrull.solver.errors import RequestError

KernelFn = Callable[..., torch.Tensor]
KERNEL_NAMES: tuple[str, ...] = ("flash-attn-4", "flash-attn", "torch-varlen", "sdpa", "reference")
#: Compute capability majors flash-attn 4 runs on: Hopper (sm90) and Blackwell (sm100).
FLASH_ATTN_4_MAJORS = (9, 10)
_HALF = (torch.float16, torch.bfloat16)
#: Query rows per block of the reference kernel: bounds its score matrix to ``H * 1024 * k_len`` floats.
REFERENCE_BLOCK_ROWS = 1024


@dataclass(frozen=True, slots=True)
class AttentionKernel:
    """A named varlen attention function (see the module docstring for the calling convention)."""

    name: str
    fn: KernelFn

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_k: torch.Tensor,
        max_seqlen_q: int,
        max_seqlen_k: int,
        causal: bool = True,
        scale: float | None = None,
        softcap: float | None = None,
        window: int | None = None,
    ) -> torch.Tensor:
        if q.shape[0] == 0:
            return q.new_zeros(q.shape[0], q.shape[1], v.shape[2])
        if q.shape[1] % k.shape[1] != 0:
            raise ValueError(f"query heads {q.shape[1]} are not a multiple of key/value heads {k.shape[1]}")
        if softcap is not None and not softcap > 0:
            raise ValueError(f"softcap {softcap}: must be > 0 (or None)")
        if window is not None and (not causal or window < 1):
            raise ValueError(f"window {window}: a sliding window is >= 1 keys and causal")
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        features = Features(softcap=softcap or 0.0, window=window)
        if features.any and self.name in ("sdpa", "torch-varlen") and softcap:
            # neither has a softcap argument: the scores are written out (exact, float32)
            return _reference(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, features)
        if features.any:
            return self.fn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale, features)
        return self.fn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale)


@dataclass(frozen=True, slots=True)
class Features:
    """The optional score transforms of a call (module doc): ``softcap`` 0 is none, ``window`` None is none."""

    softcap: float = 0.0
    window: int | None = None

    @property
    def any(self) -> bool:
        return bool(self.softcap) or self.window is not None


NO_FEATURES = Features()


@dataclass(frozen=True, slots=True)
class VarlenCall:
    """One call in the varlen spelling (module doc), bundled: what every backend's body takes."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    causal: bool
    scale: float
    features: Features = NO_FEATURES


def backend(body: Callable[[VarlenCall], torch.Tensor]) -> KernelFn:
    """A backend's ``KernelFn``, the positional spelling ``AttentionKernel`` calls (``q, k, v, cu_q, cu_k,
    max_q, max_k, causal, scale[, features]``), from a ``body`` that takes the call bundled: the one place
    those ten arguments are spelt out."""

    @functools.wraps(body)
    def run(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_q: torch.Tensor,
        cu_k: torch.Tensor,
        max_q: int,
        max_k: int,
        causal: bool,
        scale: float,
        features: Features = NO_FEATURES,
    ) -> torch.Tensor:
        return body(VarlenCall(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, features))

    return run


def _visible(rows: torch.Tensor, cols: torch.Tensor, offset: int, window: int | None) -> torch.Tensor:
    """Bottom-right causal visibility (query row ``i`` at key position ``i + offset``), within ``window``."""
    visible = cols <= rows + offset
    if window is not None:
        visible = visible & (cols > rows + offset - window)
    return visible


def _segments(cu_q: torch.Tensor, cu_k: torch.Tensor) -> list[tuple[int, int, int, int]]:
    qs = [int(x) for x in cu_q.tolist()]
    ks = [int(x) for x in cu_k.tolist()]
    if len(qs) != len(ks):
        raise ValueError(f"cu_seqlens_q has {len(qs)} entries but cu_seqlens_k has {len(ks)}")
    return [(qs[i], qs[i + 1], ks[i], ks[i + 1]) for i in range(len(qs) - 1)]


def _reference_of(call: VarlenCall) -> torch.Tensor:
    """softmax(softcap(q k^T * scale) + mask) v per segment, in float32; rows with no visible key give 0."""
    q, k, v, scale, features = call.q, call.k, call.v, call.scale, call.features
    rep = q.shape[1] // k.shape[1]
    out = q.new_zeros(q.shape[0], q.shape[1], v.shape[2])
    pieces = []
    for q0, q1, k0, k1 in _segments(call.cu_q, call.cu_k):
        q_len, k_len = q1 - q0, k1 - k0
        if q_len == 0:
            continue
        kh = k[k0:k1].float().repeat_interleave(rep, dim=1).transpose(0, 1)  # [H, k_len, D]
        vh = v[k0:k1].float().repeat_interleave(rep, dim=1).transpose(0, 1)
        for b0 in range(0, q_len, REFERENCE_BLOCK_ROWS):
            b1 = min(q_len, b0 + REFERENCE_BLOCK_ROWS)
            qh = q[q0 + b0 : q0 + b1].float().transpose(0, 1)  # [H, rows, D]
            scores = torch.matmul(qh, kh.transpose(1, 2)) * scale
            if features.softcap:
                scores = torch.tanh(scores / features.softcap) * features.softcap
            if call.causal:
                rows = torch.arange(b0, b1, device=q.device).unsqueeze(1)
                cols = torch.arange(k_len, device=q.device).unsqueeze(0)
                visible = _visible(rows, cols, k_len - q_len, features.window)
                scores = scores.masked_fill(~visible, float("-inf"))
                probs = torch.softmax(scores, dim=-1).masked_fill(~visible.any(dim=1, keepdim=True), 0.0)
            else:
                probs = torch.softmax(scores, dim=-1)
            pieces.append((q0 + b0, q0 + b1, torch.matmul(probs, vh).transpose(0, 1).to(q.dtype)))
    if not pieces:
        return out
    index = torch.cat([torch.arange(a, b, device=q.device) for a, b, _ in pieces])
    return out.index_copy(0, index, torch.cat([p for _, _, p in pieces]))


_reference = backend(_reference_of)


def _sdpa_of(call: VarlenCall) -> torch.Tensor:
    from torch.nn.attention.bias import causal_lower_right

    if call.features.softcap:  # sdpa has no softcap: the scores written out
        return _reference_of(call)
    q, k, v, causal, features = call.q, call.k, call.v, call.causal, call.features
    outs = []
    for q0, q1, k0, k1 in _segments(call.cu_q, call.cu_k):
        q_len, k_len = q1 - q0, k1 - k0
        if q_len == 0:
            continue
        qh, kh, vh = (t.transpose(0, 1).unsqueeze(0) for t in (q[q0:q1], k[k0:k1], v[k0:k1]))
        mask: Any = None
        if features.window is not None:
            rows = torch.arange(q_len, device=q.device).unsqueeze(1)
            cols = torch.arange(k_len, device=q.device).unsqueeze(0)
            mask = _visible(rows, cols, k_len - q_len, features.window)
        elif causal and q_len != k_len:
            mask = causal_lower_right(q_len, k_len)
        o = F.scaled_dot_product_attention(
            qh,
            kh,
            vh,
            attn_mask=mask,
            is_causal=causal and q_len == k_len and mask is None,
            scale=call.scale,
            enable_gqa=True,
        )
        outs.append(o.squeeze(0).transpose(0, 1))
    return torch.cat(outs) if outs else q.new_zeros(q.shape[0], q.shape[1], v.shape[2])


_sdpa = backend(_sdpa_of)


def _torch_varlen() -> KernelFn | None:
    try:
        module = importlib.import_module("torch.nn.attention.varlen")
    except ImportError:
        return None
    varlen = getattr(module, "varlen_attn", None)
    if varlen is None:
        return None
    params = inspect.signature(varlen).parameters

    def run(call: VarlenCall) -> torch.Tensor:
        q, k, v, causal, window = call.q, call.k, call.v, call.causal, call.features.window
        extra: dict[str, Any] = {"scale": call.scale}
        left = -1 if window is None else window - 1
        if "window_size" in params:
            extra["window_size"] = (left, 0) if causal else (-1, -1)
        elif window is not None:  # no window argument: the scores written out
            return _reference_of(call)
        else:
            extra["is_causal"] = causal
        if q.shape[1] != k.shape[1]:
            if "enable_gqa" in params:
                extra["enable_gqa"] = True
            else:
                rep = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out: torch.Tensor = varlen(q, k, v, call.cu_q, call.cu_k, call.max_q, call.max_k, **extra)
        return out

    return backend(run)


def _import(name: str) -> Any:
    """``importlib.import_module`` (one place for tests to stand in for what is installed)."""
    return importlib.import_module(name)


def _capability(device: torch.device) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]


def _flash_features(features: Features) -> dict[str, Any]:
    """flash-attn's spelling of the call's features (2 and 4 alike): ``softcap``, ``window_size``."""
    extra: dict[str, Any] = {}
    if features.softcap:
        extra["softcap"] = features.softcap
    if features.window is not None:
        extra["window_size"] = (features.window - 1, 0)
    return extra


def _flash_attn() -> KernelFn | None:
    """flash-attn 2's varlen function, when the package imports (any failure: not usable)."""
    try:
        module = _import("flash_attn")
    except Exception:  # an installed wheel can fail to load (CUDA/ABI mismatch): not usable
        return None
    flash = getattr(module, "flash_attn_varlen_func", None)
    if flash is None:
        return None

    def run(call: VarlenCall) -> torch.Tensor:
        extra = _flash_features(call.features)
        out: torch.Tensor = flash(
            call.q, call.k, call.v, call.cu_q, call.cu_k, call.max_q, call.max_k,
            softmax_scale=call.scale, causal=call.causal, **extra,
        )  # fmt: skip
        return out

    return backend(run)


def _flash_attn_4() -> KernelFn | None:
    """flash-attn 4's varlen function (``flash_attn.cute``), when it imports. Its keyword names are taken
    from its signature and a ``(out, lse)`` result is reduced to ``out``."""
    try:
        module = _import("flash_attn.cute")
    except Exception:
        return None
    flash = getattr(module, "flash_attn_varlen_func", None)
    if flash is None:
        return None
    params: Mapping[str, Any]
    try:
        params = inspect.signature(flash).parameters
    except (TypeError, ValueError):
        params = {}
    scale_name = "softmax_scale" if "softmax_scale" in params or not params else "scale"

    def run(call: VarlenCall) -> torch.Tensor:
        features = call.features
        missing = (features.softcap and "softcap" not in params) or (
            features.window is not None and "window_size" not in params
        )
        if missing:
            # this build has no such argument: the scores written out (exact, float32)
            return _reference_of(call)
        extra: dict[str, Any] = {scale_name: call.scale, "causal": call.causal, **_flash_features(features)}
        if not params or "max_seqlen_q" in params:
            extra.update(max_seqlen_q=call.max_q, max_seqlen_k=call.max_k)
        out: Any = flash(call.q, call.k, call.v, cu_seqlens_q=call.cu_q, cu_seqlens_k=call.cu_k, **extra)
        result: torch.Tensor = out[0] if isinstance(out, tuple) else out
        return result

    return backend(run)


def _factory(name: str) -> KernelFn | None:
    if name == "flash-attn-4":
        return _flash_attn_4()
    if name == "flash-attn":
        return _flash_attn()
    if name == "torch-varlen":
        return _torch_varlen()
    if name == "sdpa":
        return _sdpa
    return _reference


def _unusable_reason(name: str, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why backend ``name`` cannot run ``dtype`` on ``device`` (None: it can, trial call aside)."""
    if name in ("sdpa", "reference"):
        return None
    if device.type != "cuda":
        return f"needs CUDA, not {device.type}"
    if dtype not in _HALF:
        return f"needs float16 or bfloat16, not {str(dtype).removeprefix('torch.')}"
    if name == "flash-attn-4":
        major, minor = _capability(device)
        if major not in FLASH_ATTN_4_MAJORS:
            return f"needs sm90 or sm100, this GPU is sm{major}{minor}"
        if _flash_attn_4() is None:
            return "flash_attn.cute does not import (pip install flash-attn-4)"
    elif name == "flash-attn":
        if _flash_attn() is None:
            return "flash_attn (2) is not installed"
    elif name == "torch-varlen" and _torch_varlen() is None:
        return "torch.nn.attention.varlen is not in this torch"
    return None


def trial_error(kernel: AttentionKernel, device: torch.device, dtype: torch.dtype) -> str | None:
    """Run ``kernel`` forward and backward on two segments (8 whole tokens; 4 queries of a shard piece
    over a 12-key prefix), GQA 4/2 heads of 64, and compare with the float32 reference: None when it
    agrees, else what went wrong (an exception's text, or the error)."""
    gen = torch.Generator().manual_seed(0)
    cu_q = torch.tensor([0, 8, 12], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 8, 20], dtype=torch.int32, device=device)
    q = torch.randn(12, 4, 64, generator=gen).to(device=device, dtype=dtype).requires_grad_(True)
    k = torch.randn(20, 2, 64, generator=gen).to(device=device, dtype=dtype).requires_grad_(True)
    v = torch.randn(20, 2, 64, generator=gen).to(device=device, dtype=dtype).requires_grad_(True)

    def call(kern: AttentionKernel, *qkv: torch.Tensor) -> torch.Tensor:
        return kern(*qkv, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=8, max_seqlen_k=12)

    try:
        out = call(kernel, q, k, v)
        out.float().square().sum().backward()  # type: ignore[no-untyped-call]
        grad_q = q.grad
    except Exception as exc:  # any failure of a third-party kernel here means: do not use it
        return f"trial call failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    ref = AttentionKernel(name="reference", fn=_reference)
    qf, kf, vf = (t.detach().float().requires_grad_(True) for t in (q, k, v))
    want = call(ref, qf, kf, vf)
    want.square().sum().backward()  # type: ignore[no-untyped-call]
    tolerance = 2e-2 if dtype in _HALF else 1e-4
    error = float((out.detach().float() - want.detach()).abs().max()) / max(float(want.abs().max()), 1e-6)
    if grad_q is None or not bool(torch.isfinite(grad_q).all()):
        return "trial call: no finite query gradient"
    if not error <= tolerance:
        return f"trial call disagrees with the reference (relative error {error:.2e} > {tolerance:.0e})"
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelChoice:
    """The backend that runs and why each better one does not (``(name, reason)`` pairs)."""

    kernel: AttentionKernel
    skipped: tuple[tuple[str, str], ...] = field(default=())
    requested: bool = False

    def describe(self) -> str:
        """One log line: ``attention kernel: NAME (why); passed over: a (why), b (why)``."""
        why = "requested" if self.requested else "best usable"
        text = f"attention kernel: {self.kernel.name} ({why})"
        if self.skipped:
            text += "; passed over: " + ", ".join(f"{n} ({r})" for n, r in self.skipped)
        return text


def available_kernels(device: torch.device, dtype: torch.dtype) -> tuple[str, ...]:
    """Backends that import and fit ``device``/``dtype``, best first (trial calls aside)."""
    names = [n for n in KERNEL_NAMES if _unusable_reason(n, device, dtype) is None]
    if device.type == "cpu":  # the reference first on CPU: exact float32 softmax, no kernel selection
        names.remove("reference")
        names.insert(0, "reference")
    return tuple(names)


def choose_kernel(device: torch.device, dtype: torch.dtype, name: str | None = None) -> KernelChoice:
    """The best backend for ``device``/``dtype`` whose trial call passes (CUDA backends), or ``name`` when
    given (refused if unusable there), with the reasons the better ones were passed over."""
    if name is not None and name not in KERNEL_NAMES:
        raise RequestError("kernel", name, f"unknown attention kernel; known: {', '.join(KERNEL_NAMES)}")
    usable = available_kernels(device, dtype)
    if name is not None:
        if name not in usable:
            why = _unusable_reason(name, device, dtype) or "not usable here"
            raise RequestError(
                "kernel", name, f"not usable: {why}; usable for {dtype} on {device.type}: {', '.join(usable)}"
            )
        fn = _factory(name)
        assert fn is not None, f"{name} was listed as usable"
        return KernelChoice(kernel=AttentionKernel(name=name, fn=fn), requested=True)
    skipped: list[tuple[str, str]] = []
    for candidate in KERNEL_NAMES if device.type != "cpu" else usable:
        reason: str | None = _unusable_reason(candidate, device, dtype)
        if reason is None:
            fn = _factory(candidate)
            assert fn is not None, f"{candidate} was found usable"
            kernel = AttentionKernel(name=candidate, fn=fn)
            if device.type == "cuda" and candidate not in ("sdpa", "reference"):
                reason = trial_error(kernel, device, dtype)
            if reason is None:
                return KernelChoice(kernel=kernel, skipped=tuple(skipped))
        skipped.append((candidate, reason or "-"))
    raise AssertionError("the reference kernel is always usable")


@functools.cache
def _chosen(device: torch.device, dtype: torch.dtype, name: str | None) -> KernelChoice:
    choice = choose_kernel(device, dtype, name)
    logging.getLogger(__name__).info(choice.describe())
    return choice


def select_kernel(device: torch.device, dtype: torch.dtype, name: str | None = None) -> AttentionKernel:
    """The best backend for ``device``/``dtype``, or ``name`` when given (refused if unusable there).

    Chosen once per process for each device, dtype and name (trial calls run once), logged at INFO by
    ``skrull.worker.kernels``; ``kernel_choice`` gives the choice with its reasons."""
    return kernel_choice(device, dtype, name).kernel


def kernel_choice(device: torch.device, dtype: torch.dtype, name: str | None = None) -> KernelChoice:
    """``choose_kernel``'s result, computed once per process per (device, dtype, name)."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return _chosen(device, dtype, name)

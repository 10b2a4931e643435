"""The LM head and its cross-entropy fused and chunked over tokens: ``[T, vocab]`` logits never exist.

Why: at long context the head dominates memory. Qwen2.5's 151,936-entry vocabulary over 26k tokens
makes float32 logits of 16 GB, and their gradient as much again; the decoder layers of a whole
microbatch need less. Here the head runs ``chunk_tokens`` rows at a time and each chunk's gradient is
taken in the forward pass, while its logits are at hand (the scheme of Liger-Kernel's fused linear
cross-entropy; Hsu et al. 2024, arXiv:2410.10989):

    lse_i  = log sum_v exp(z_iv),            z = h W^T (+ b), in float32
    loss   = sum_{i: y_i != ignore} (lse_i - z_{i,y_i})
    dz_i   = softmax(z_i) - onehot(y_i)      (0 for ignored rows)
    dh     = dz W,    dW = dz^T h,    db = sum_i dz_i

With a final logit softcap ``c`` (Gemma 2's ``final_logit_softcapping``) the loss is taken on
``c tanh(z / c)`` and the chain rule multiplies ``dz`` by ``1 - tanh^2(z / c)``,

so the peak is one chunk's ``[chunk, vocab]`` float32 logits (2.5 GB at 4,096 rows of Qwen2.5) and the
head's matmuls run three times (``z``, ``dh``, ``dW``) instead of four under activation checkpointing.
Backward only scales the stored ``dh``, ``dW``, ``db`` by the incoming scalar gradient (the loss is a
sum, later divided by the global target count: worker/loss.py).

On a CUDA device with ``liger-kernel`` installed its Triton kernel does the same in fewer passes
(``backend="auto"``); elsewhere this PyTorch version runs (tests/worker/test_fused_ce.py: equal to the
plain ``cross_entropy`` of the whole logits, loss and gradients).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from skrull.worker.loss import IGNORE_INDEX

#: Rows per chunk when none is given: 4,096 rows of a 152k vocabulary are 2.5 GB of float32 logits.
DEFAULT_CHUNK_TOKENS = 4096
BACKENDS = ("auto", "torch", "liger")


class _LinearCrossEntropySum(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        labels: torch.Tensor,
        chunk_tokens: int,
        ignore_index: int,
        softcap: float | None,
    ) -> torch.Tensor:
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_b = bias is not None and ctx.needs_input_grad[2]
        grad_hidden = torch.empty_like(hidden) if need_h else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_bias = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_b else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk_tokens):
            h = hidden[start : start + chunk_tokens]
            y = labels[start : start + chunk_tokens]
            logits = torch.nn.functional.linear(h, weight, bias).float()  # [c, V]
            squash = None
            if softcap is not None:  # z <- c tanh(z / c); keep tanh for the chain rule
                squash = logits.div_(softcap).tanh_()
                logits = squash * softcap
            valid = y != ignore_index
            target = torch.where(valid, y, torch.zeros_like(y))
            lse = torch.logsumexp(logits, dim=-1)
            picked = logits.gather(1, target.unsqueeze(1)).squeeze(1)
            total += torch.where(valid, lse - picked, torch.zeros_like(lse)).sum()
            if grad_hidden is None and grad_weight is None and grad_bias is None:
                continue
            # dz = softmax - onehot, in place over the logits; ignored rows contribute nothing
            dz = logits.sub_(lse.unsqueeze(1)).exp_()
            dz.scatter_add_(1, target.unsqueeze(1), torch.full_like(lse, -1.0).unsqueeze(1))
            dz.mul_(valid.unsqueeze(1))
            if squash is not None:  # d(c tanh(z/c))/dz = 1 - tanh^2(z/c)
                dz.mul_(squash.square_().neg_().add_(1.0))
            dz_low = dz.to(hidden.dtype)
            if grad_hidden is not None:
                grad_hidden[start : start + chunk_tokens] = dz_low @ weight
            if grad_weight is not None:
                grad_weight += (dz_low.t() @ h).float()
            if grad_bias is not None:
                grad_bias += dz.sum(dim=0)
        ctx.save_for_backward(
            *(t if t is not None else torch.empty(0) for t in (grad_hidden, grad_weight, grad_bias))
        )
        ctx.present = (grad_hidden is not None, grad_weight is not None, grad_bias is not None)
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        return total

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        gh, gw, gb = ctx.saved_tensors
        has_h, has_w, has_b = ctx.present
        w_dtype, b_dtype = ctx.dtypes
        return (
            gh * grad.to(gh.dtype) if has_h else None,
            (gw * grad).to(w_dtype) if has_w else None,
            (gb * grad).to(b_dtype) if has_b else None,
            None,
            None,
            None,
            None,
        )


def _liger() -> Any:
    try:
        module = importlib.import_module("liger_kernel.transformers.functional")
    except ImportError:
        return None
    return getattr(module, "liger_fused_linear_cross_entropy", None)


def resolve_backend(backend: str, device: torch.device) -> str:
    """``"liger"`` on CUDA when ``liger-kernel`` imports (for ``"auto"``), else ``"torch"``."""
    if backend not in BACKENDS:
        raise ValueError(f"fused cross-entropy backend {backend!r} is not one of {', '.join(BACKENDS)}")
    if backend == "auto":
        return "liger" if device.type == "cuda" and _liger() is not None else "torch"
    if backend == "liger" and (device.type != "cuda" or _liger() is None):
        raise ValueError("fused cross-entropy backend 'liger' needs a CUDA device and liger-kernel installed")
    return backend


def linear_cross_entropy_sum(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    ignore_index: int = IGNORE_INDEX,
    backend: str = "auto",
    softcap: float | None = None,
) -> torch.Tensor:
    """``sum_i CE(hidden_i W^T + b, labels_i)`` over the rows whose label is not ``ignore_index``, in
    float32, without the whole logits (module docstring). ``hidden`` ``[T, h]``, ``weight`` ``[V, h]``;
    ``softcap`` takes the loss on ``softcap * tanh(z / softcap)`` (PyTorch path only)."""
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be a number > 0 or None, got {softcap!r}")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if hidden.dim() != 2 or labels.shape != hidden.shape[:1]:
        raise ValueError(f"hidden [T, h] and labels [T] expected; got {tuple(hidden.shape)} and {tuple(labels.shape)}")
    if softcap is None and resolve_backend(backend, hidden.device) == "liger":
        out: torch.Tensor = _liger()(hidden, weight, labels, bias=bias, ignore_index=ignore_index, reduction="sum")
        return out.float()
    total: torch.Tensor = _LinearCrossEntropySum.apply(  # type: ignore[no-untyped-call]
        hidden, weight, bias, labels, chunk_tokens, ignore_index, softcap
    )
    return total

"""DACP attention as a registered custom operator: decoder layers compile as one graph each (or the
whole stack as one) under ``torch.compile``.

Why: the regional compile (worker/compiling.py, ``compile="on"``) breaks each layer's graph at the
attention (``torch.compiler.disable``), so every layer runs as two compiled pieces around an eager call;
on one H100 (docs/gpu-check/2026-11-26) that step was no faster than eager at 1,024 and 4,096 tokens
(host-bound, ~3 ms per layer). Registered as ``torch.ops.skrull.dacp_attention`` with a fake (shape)
function and an autograd formula, the attention is one opaque node the compiler keeps in the graph: the
layer compiles whole (``fullgraph=True``; ``compile="fullgraph"`` or ``"stack"``), and the node's eager
body runs the existing DACP code unchanged, collectives included (worker/dacp.py: local sequences over
``cu_seqlens``, shard pieces with ``allgather`` or ``ulysses``, any kernel of worker/kernels.py).

How the microbatch's plan reaches the node: a graph must not take the ``DACPPlan`` (a Python object
whose integers change every microbatch: dynamo would guard on them and recompile). The plan is
registered here (``plan_token``) and the graph carries only its *token*: a one-element CPU tensor holding
the plan's serial number, a graph input like any activation (its size is always 1, its value is never
guarded on). The node's body reads the number (a CPU tensor: no device synchronisation) and finds the
plan. Serial numbers are never reused. The registry keeps the last ``REGISTRY_SIZE`` plans: microbatches
may be in flight together (forwards of several before their backwards) and each backward finds its own
plan; a token whose plan was dropped is refused with an error, never matched to another plan.

Backward is stateless: ``dacp_attention_backward`` runs the DACP forward again under autograd on the
saved ``q``, ``k``, ``v`` and differentiates it (the CP Functions' own backward: reduce-scatter,
all-to-all). Nothing is kept between forward and backward but the inputs, so activation checkpointing,
microbatches in flight and compiled graphs need no bookkeeping; the price is one more attention forward
per layer in backward (and, for a microbatch with shard pieces, its forward collective once more):
attention only, like selective activation recomputation (Korthikanti et al. 2022).

An operator's body runs below the autograd dispatch keys (PyTorch excludes them while it runs a
kernel), so the backward body turns them back on for its nested autograd (``_autograd_inside``,
``torch._C._ForceDispatchKeyGuard``): the nested graph is the kernels' own, exactly as in eager mode.

Rows past the layout's ``num_tokens`` are padding (a group member with no token runs one dummy row;
``pad_to_bucket`` in worker/hf/inputs.py pads a microbatch to a bucketed size): their output is zero and
they receive and pass on no gradient.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from typing import Any

import torch

from skrull.worker.dacp import DACPPlan, dacp_attention

#: Plans kept findable at once (microbatches whose forward ran and whose backward may still run).
REGISTRY_SIZE = 1024
_BY_PLAN: OrderedDict[int, tuple[DACPPlan, torch.Tensor]] = OrderedDict()
_BY_SERIAL: dict[int, DACPPlan] = {}
_SERIALS = itertools.count(1)


def plan_token(plan: DACPPlan) -> torch.Tensor:
    """The token of ``plan`` (registered on first use): what a compiled graph carries instead of the plan."""
    entry = _BY_PLAN.get(id(plan))
    if entry is not None and entry[0] is plan:
        _BY_PLAN.move_to_end(id(plan))
        return entry[1]
    serial = next(_SERIALS)
    token = torch.tensor([serial], dtype=torch.int64)  # on the CPU: read without a device synchronisation
    _BY_PLAN[id(plan)] = (plan, token)
    _BY_SERIAL[serial] = plan
    while len(_BY_PLAN) > REGISTRY_SIZE:
        _, (_, old_token) = _BY_PLAN.popitem(last=False)
        _BY_SERIAL.pop(int(old_token), None)
    return token


def plan_of(token: torch.Tensor) -> DACPPlan:
    """The plan whose token is ``token`` (a ``LookupError`` when it is no longer registered)."""
    if token.device.type != "cpu" or token.numel() != 1:
        raise LookupError(f"DACP attention: not a plan token ({token.numel()} values on {token.device})")
    plan = _BY_SERIAL.get(int(token))
    if plan is None:
        raise LookupError(
            f"DACP attention: the microbatch's plan is no longer registered (more than {REGISTRY_SIZE} "
            "microbatches ran forward since this one, or the registry was cleared)"
        )
    return plan


def registered_plans() -> int:
    return len(_BY_PLAN)


def clear_plans() -> None:
    """Forget every registered plan (their tokens are refused from now on)."""
    _BY_PLAN.clear()
    _BY_SERIAL.clear()


def _autograd_inside() -> Any:
    """A guard that re-enables the autograd dispatch keys an operator's body runs without."""
    keys = torch._C.DispatchKey
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for key in (keys.AutogradFunctionality, keys.AutogradOther, keys.AutogradNestedTensor, keys.ADInplaceOrView):
        exclude = exclude.remove(key)
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude)


def _tags() -> tuple[Any, ...]:
    """``cudagraph_unsafe`` where this torch has it: a CUDA-graph partition leaves the node outside the
    graph (its body reads the plan's tensors and may run collectives, which a replay must not freeze)."""
    tag = getattr(torch.Tag, "cudagraph_unsafe", None)
    return (tag,) if tag is not None else ()


def _run(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: DACPPlan, softcap: float | None, window: int | None
) -> torch.Tensor:
    """DACP attention over the layout's rows of ``q``/``k``/``v`` ``[rows, H, D]``; zero on padding rows."""
    n = plan.layout.num_tokens
    rows = q.shape[0]
    if rows < n:
        raise ValueError(f"the buffer has {rows} rows, the microbatch layout {n}")
    out = dacp_attention(q[:n], k[:n], v[:n], plan, softcap=softcap or None, window=window)
    if rows > n:
        out = torch.cat([out, out.new_zeros(rows - n, *out.shape[1:])])
    return out


@torch.library.custom_op("skrull::dacp_attention", mutates_args=(), tags=_tags())
def dacp_attention_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, token: torch.Tensor, softcap: float, window: int
) -> torch.Tensor:
    """Causal DACP attention of the plan ``token`` stands for: ``q`` ``[T, H, D]``, ``k``/``v`` ``[T, H_kv, D]``
    -> ``[T, H, D_v]``. ``softcap`` 0 and ``window`` 0 mean none (worker/kernels.py)."""
    with torch.no_grad():
        out = _run(q, k, v, plan_of(token), softcap or None, window or None)
    result: torch.Tensor = out.contiguous()
    return result


@dacp_attention_op.register_fake
def _dacp_attention_fake(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, token: torch.Tensor, softcap: float, window: int
) -> torch.Tensor:
    return q.new_empty(q.shape[0], q.shape[1], v.shape[2])


@torch.library.custom_op("skrull::dacp_attention_backward", mutates_args=(), tags=_tags())
def dacp_attention_backward(
    grad: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    token: torch.Tensor,
    softcap: float,
    window: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)``: the DACP forward run again under autograd, differentiated (module docstring)."""
    plan = plan_of(token)
    with _autograd_inside(), torch.enable_grad():
        leaves = tuple(t.detach().requires_grad_(True) for t in (q, k, v))
        out = _run(leaves[0], leaves[1], leaves[2], plan, softcap or None, window or None)
        grads = torch.autograd.grad(out, leaves, grad.to(out.dtype), allow_unused=True)
    return tuple(  # type: ignore[return-value]
        (g if g is not None else torch.zeros_like(t)).contiguous() for g, t in zip(grads, leaves, strict=True)
    )


@dacp_attention_backward.register_fake
def _dacp_attention_backward_fake(
    grad: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    token: torch.Tensor,
    softcap: float,
    window: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    q, k, v, token, softcap, window = inputs
    ctx.save_for_backward(q, k, v, token)
    ctx.softcap, ctx.window = softcap, window


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    q, k, v, token = ctx.saved_tensors
    dq, dk, dv = dacp_attention_backward(grad.contiguous(), q, k, v, token, ctx.softcap, ctx.window)
    return dq, dk, dv, None, None, None


dacp_attention_op.register_autograd(_backward, setup_context=_setup_context)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    token: torch.Tensor,
    *,
    softcap: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """The operator with Python's spelling of the features (``None``: none)."""
    if window is not None and window < 1:
        raise ValueError(f"sliding_window={window!r}: must be an integer >= 1 (or None)")
    out: torch.Tensor = torch.ops.skrull.dacp_attention(q, k, v, token, float(softcap or 0.0), int(window or 0))
    return out

"""Regional ``torch.compile`` of decoder layers with a dynamic token count: the fast step's compiler.

Why: eager PyTorch issues every operator from the host. On one H100 (docs/gpu-check/README.md) a
Qwen2.5-0.5B microbatch took ~150 ms whatever its size (host-bound up to thousands of tokens) and the
same step compiled took 52.7 ms at 1,024 tokens. Compiling only the repeated block (PyTorch's
"regional compilation") keeps the cold start to one layer's compile, shared by every layer: the
layers are instances of one class, so they run one compiled code object whose parameters are graph
inputs (``torch._dynamo.config.inline_inbuilt_nn_modules``, on by default since torch 2.5).

What is compiled and what is not:

- each layer's ``forward`` (norms, projections, rotary embedding, MLP) is compiled; the module's
  ``__call__`` stays eager, so hooks of FSDP2 ``fully_shard``, DDP and activation checkpointing run
  outside the graph as they do without compilation;
- the attention call is a graph break (``attention_graph_break``: ``torch.compiler.disable``): the
  DACP collectives (all-gather, reduce-scatter, all-to-all) and the varlen kernel (flash-attn 4/2,
  PyTorch's varlen, the CPU reference) run eagerly between two compiled graphs. Their Python control
  flow depends on the plan (which rows are local, which are shard pieces), which a graph must not
  specialise on.

No recompilation per microbatch: a planned microbatch's token count changes every time, so the layers
are compiled with ``dynamic=True``: the first compile is symbolic in every activation size (the
parameters' shapes stay static, ``force_parameter_static_shapes``), including the tensors that enter
the graph after the attention's graph break. (Marking only the token dimension with
``maybe_mark_dynamic`` was tried: the graphs resumed after the break still compiled static first and
recompiled on the second token count.) Dynamo specialises sizes 0 and 1: a one-row microbatch (the
padding row of a GPU idle in a group) compiles once more, the first time one occurs.
``compile_count()`` counts compiled frames; tests/worker/hf/test_fast.py asserts it stays put over
new token counts after warm-up.

CUDA graphs are not used: every microbatch has another token count (a graph per shape) and the
attention call breaks the graph.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

#: Attribute set on a layer whose forward is compiled here (idempotence, and for tests).
COMPILED_ATTR = "_skrull_compiled"
#: ``compile`` values: on, off, or the device's default (on for CUDA, off elsewhere).
COMPILE_CHOICES = ("auto", "on", "off")


def compile_default(device: torch.device) -> bool:
    """Compile by default on CUDA; on a CPU inductor's compile takes longer than the short runs there."""
    return device.type == "cuda"


def resolve_compile(choice: str | bool | None, device: torch.device) -> bool:
    """``True``/``"on"``, ``False``/``"off"``, or ``None``/``"auto"`` (``compile_default``)."""
    if isinstance(choice, bool):
        return choice
    if choice is None or choice == "auto":
        return compile_default(device)
    if choice == "on":
        return True
    if choice == "off":
        return False
    raise ValueError(f"compile: {choice!r} is not one of {', '.join(COMPILE_CHOICES)} (or a bool)")


def attention_graph_break(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run eagerly inside compiled code: a graph break (``torch.compiler.disable``)."""
    disabled: Callable[..., Any] = torch.compiler.disable(fn)  # type: ignore[no-untyped-call]
    return disabled


_COMPILED: dict[tuple[type[nn.Module], tuple[tuple[str, Any], ...]], Callable[..., Any]] = {}


def _compiled_forward(cls: type[nn.Module], options_key: tuple[tuple[str, Any], ...]) -> Callable[..., Any]:
    """One compiled function per layer class (all its instances share its code and its graphs)."""
    key = (cls, options_key)
    if key not in _COMPILED:
        _COMPILED[key] = torch.compile(cls.forward, **dict(options_key))
    return _COMPILED[key]


def compile_layers(layers: Sequence[nn.Module], *, mode: str | None = None, fullgraph: bool = False) -> int:
    """Compile each layer's ``forward`` in place (module docstring); returns how many were compiled now.
    Idempotent per layer; ``mode`` is ``torch.compile``'s (None: its default)."""
    options: dict[str, Any] = {"dynamic": True, "fullgraph": fullgraph}
    if mode is not None:
        options["mode"] = mode
    count = 0
    for layer in layers:
        if getattr(layer, COMPILED_ATTR, False):
            continue
        compiled = _compiled_forward(type(layer), tuple(sorted(options.items())))
        layer.forward = types.MethodType(compiled, layer)
        setattr(layer, COMPILED_ATTR, True)
        count += 1
    return count


def is_compiled(layer: nn.Module) -> bool:
    return bool(getattr(layer, COMPILED_ATTR, False))


def compile_count() -> int:
    """Frames dynamo has compiled in this process so far (every compile and recompile counts one)."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["ok"])

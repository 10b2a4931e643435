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
#: ``compile`` values: on (regional), off, the device's default (regional on CUDA, off elsewhere),
#: ``fullgraph`` (each layer one graph, the attention a registered operator: worker/attention_op.py), or
#: ``stack`` (the whole decoder stack one graph: embedding, every layer, final norm; not under FSDP2), or
#: ``cudagraphs`` (``fullgraph`` under CUDA graphs, CUDA only, off unless asked: see ``cudagraph_options``).
COMPILE_CHOICES = ("auto", "on", "off", "fullgraph", "stack", "cudagraphs")
#: How compiled layers are cut: two graphs around the eager attention, one graph per layer, one graph for
#: the whole stack, or one graph per layer replayed as CUDA graphs.
REGIONAL, FULLGRAPH, STACK, CUDAGRAPHS = "regional", "fullgraph", "stack", "cudagraphs"


def compile_default(device: torch.device) -> bool:
    """Compile by default on CUDA; on a CPU inductor's compile takes longer than the short runs there."""
    return device.type == "cuda"


def resolve_compile(choice: str | bool | None, device: torch.device) -> bool:
    """``True``/``"on"``/``"fullgraph"``, ``False``/``"off"``, or ``None``/``"auto"`` (``compile_default``)."""
    return compile_style(choice, device) is not None


def compile_style(choice: str | bool | None, device: torch.device) -> str | None:
    """``REGIONAL`` (``True``, ``"on"``, ``"auto"`` on CUDA), ``FULLGRAPH``, ``STACK``, ``CUDAGRAPHS`` (CUDA
    only), or None (eager)."""
    if isinstance(choice, bool):
        return REGIONAL if choice else None
    if choice is None or choice == "auto":
        return REGIONAL if compile_default(device) else None
    if choice == "on":
        return REGIONAL
    if choice == "fullgraph":
        return FULLGRAPH
    if choice == "stack":
        return STACK
    if choice == "cudagraphs":
        if device.type != "cuda":
            raise ValueError(f"compile: {choice!r} needs CUDA, the device is {device.type}")
        return CUDAGRAPHS
    if choice == "off":
        return None
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


KwargsHook = Callable[[dict[str, Any]], dict[str, Any]]


def compile_layers(
    layers: Sequence[nn.Module],
    *,
    mode: str | None = None,
    fullgraph: bool = False,
    prepare_kwargs: KwargsHook | None = None,
    style: str | None = None,
) -> int:
    """Compile each layer's ``forward`` in place (module docstring); returns how many were compiled now.
    Idempotent per layer; ``mode`` is ``torch.compile``'s (None: its default). ``prepare_kwargs`` rewrites
    the keyword arguments eagerly before the compiled forward sees them (worker/hf/fast.py replaces the
    microbatch's plan, a Python object the graph must not guard on, by its token). ``style`` is recorded on
    each module (``compiled_style``; by default derived from ``fullgraph`` and ``mode``)."""
    options: dict[str, Any] = {"dynamic": True, "fullgraph": fullgraph}
    if mode is not None:
        options["mode"] = mode
    count = 0
    for layer in layers:
        if getattr(layer, COMPILED_ATTR, False):
            continue
        compiled = _compiled_forward(type(layer), tuple(sorted(options.items())))
        if prepare_kwargs is None:
            layer.forward = types.MethodType(compiled, layer)
        else:
            layer.forward = types.MethodType(_with_kwargs_hook(compiled, prepare_kwargs), layer)
        if style is None:
            style = REGIONAL if not fullgraph else CUDAGRAPHS if mode == "reduce-overhead" else FULLGRAPH
        setattr(layer, COMPILED_ATTR, style)
        count += 1
    return count


def _with_kwargs_hook(compiled: Callable[..., Any], hook: KwargsHook) -> Callable[..., Any]:
    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        return compiled(self, *args, **hook(kwargs))

    return forward


def cudagraph_options() -> dict[str, Any]:
    """``torch.compile`` options of the ``cudagraphs`` style, and inductor's graph partitioning turned on
    where this torch has it.

    ``mode="reduce-overhead"`` records each layer's graph as a CUDA graph per token count and replays it:
    one launch instead of one per kernel. The attention operator is tagged ``cudagraph_unsafe``
    (worker/attention_op.py: its body reads the plan and may run collectives, which a replay would
    freeze), so with graph partitioning the layer is two CUDA graphs around the eager operator; without
    it inductor runs the graph without CUDA graphs. Every token count records its own graphs (memory and
    a recording run each): pad microbatches to a few bucketed sizes (``pad_to_bucket`` in
    worker/hf/inputs.py), which changes neither loss nor gradients. Not tested without a GPU."""
    import torch._inductor.config as inductor_config

    if hasattr(inductor_config, "graph_partition"):
        inductor_config.graph_partition = True
    return {"mode": "reduce-overhead"}


def is_compiled(layer: nn.Module) -> bool:
    return bool(getattr(layer, COMPILED_ATTR, False))


def compiled_style(layer: nn.Module) -> str | None:
    """``REGIONAL``, ``FULLGRAPH``, ``STACK`` or ``CUDAGRAPHS`` for a module compiled here, else None."""
    style = getattr(layer, COMPILED_ATTR, None)
    return style if isinstance(style, str) else None


def compile_count() -> int:
    """Graphs dynamo has compiled in this process so far (every compile and recompile counts one; a layer
    cut by a graph break counts one per piece). Counted by graphs, not frames: a ``fullgraph=True`` compile
    does not pass through the frame counter."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])

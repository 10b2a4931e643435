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

No recompilation per microbatch: a planned microbatch's token count changes every time. The token
dimension of every input (``[1, T, hidden]`` hidden states and the ``[1, T, head_dim]`` rotary tables
of a Hugging Face layer, ``[T, hidden]`` and ``[T]`` of worker/model.py's layer) and of the attention's
output is marked dynamic (``torch._dynamo.maybe_mark_dynamic``) before each call, so the first
compile is already symbolic in ``T``. Dynamo specialises sizes 0 and 1: a one-row microbatch (the
padding row of a GPU idle in a group) compiles once more, the first time one occurs.
``compile_count()`` counts compiled frames; tests/worker/test_compiling.py asserts it stays put over
new token counts after warm-up.

CUDA graphs are not used: every microbatch has another token count (a graph per shape) and the
attention call breaks the graph.
"""

from __future__ import annotations

import functools
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


def _mark_tokens(value: Any, dim: int, tokens: int) -> None:
    """Mark dimension ``dim`` of ``value`` (a tensor, or tensors in a tuple/list) dynamic where it has
    ``tokens`` entries."""
    if isinstance(value, torch.Tensor):
        if value.dim() > dim and value.shape[dim] == tokens and tokens > 1:
            torch._dynamo.maybe_mark_dynamic(value, dim)
    elif isinstance(value, tuple | list):
        for item in value:
            _mark_tokens(item, dim, tokens)


def attention_graph_break(fn: Callable[..., Any], *, token_dim: int = 1) -> Callable[..., Any]:
    """``fn`` run eagerly inside compiled code (a graph break), its output's token dimension marked
    dynamic so that the compiled graph after it is symbolic in the token count from its first compile."""

    @torch.compiler.disable  # type: ignore[misc]
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        first = out[0] if isinstance(out, tuple) else out
        if isinstance(first, torch.Tensor) and first.dim() > token_dim:
            _mark_tokens(out, token_dim, int(first.shape[token_dim]))
        return out

    return run


@functools.cache
def _compiled_forward(cls: type, options_key: tuple[tuple[str, Any], ...]) -> Callable[..., Any]:
    """One compiled function per layer class (all its instances share its code and its graphs)."""
    return torch.compile(cls.forward, **dict(options_key))  # type: ignore[no-any-return]


def compile_layers(
    layers: Sequence[nn.Module], *, token_dim: int, mode: str | None = None, fullgraph: bool = False
) -> int:
    """Compile each layer's ``forward`` in place (module docstring); returns how many were compiled now.

    ``token_dim``: the dimension holding the token count in the first positional input (1 for a Hugging
    Face layer's ``[1, T, hidden]``, 0 for worker/model.py's ``[T, hidden]``); every tensor input whose
    that dimension has the same size is marked dynamic too. Idempotent per layer.
    """
    options: dict[str, Any] = {"dynamic": None, "fullgraph": fullgraph}
    if mode is not None:
        options["mode"] = mode
    count = 0
    for layer in layers:
        if getattr(layer, COMPILED_ATTR, False):
            continue
        compiled = _compiled_forward(type(layer), tuple(sorted(options.items())))

        def forward(self: nn.Module, *args: Any, _compiled: Any = compiled, **kwargs: Any) -> Any:
            first = args[0] if args else next(iter(kwargs.values()))
            if isinstance(first, torch.Tensor) and first.dim() > token_dim:
                tokens = int(first.shape[token_dim])
                _mark_tokens(args, token_dim, tokens)
                _mark_tokens(tuple(kwargs.values()), token_dim, tokens)
            return _compiled(self, *args, **kwargs)

        layer.forward = types.MethodType(forward, layer)  # type: ignore[method-assign]
        setattr(layer, COMPILED_ATTR, True)
        count += 1
    return count


def is_compiled(layer: nn.Module) -> bool:
    return bool(getattr(layer, COMPILED_ATTR, False))


def compile_count() -> int:
    """Frames dynamo has compiled in this process so far (every compile and recompile counts one)."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["ok"])

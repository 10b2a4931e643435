"""The fast step's model: a Hugging Face causal LM with its decoder layers compiled (worker/compiling.py).

``skrull finetune``, ``SkrullTrainer`` (and so TRL's ``SkrullSFTTrainer``), the own-loop examples and
the profiler all reach the compiler through here or ``compiling.compile_layers``, so one step is what
they all run and what profiles are measured on. The attention kernel is chosen once per process
(``kernels.select_kernel``; ``kernels.describe_choice`` gives the one log line saying which and why),
and the LM head's loss is the chunked fused cross-entropy (worker/fused_ce.py) when
``loss_chunk_tokens`` is given (worker/hf/step.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from skrull.worker.attention_op import plan_token
from skrull.worker.compiling import (
    CUDAGRAPHS,
    FULLGRAPH,
    STACK,
    KwargsHook,
    compile_layers,
    compile_style,
    compiled_style,
    cudagraph_options,
)
from skrull.worker.hf.attention import PLAN_KWARG, TOKEN_KWARG


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DDP wrapper (``.module``), or the model itself (FSDP2 shards in place)."""
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, nn.Module) else model


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """A Hugging Face causal LM's repeated blocks (``model.model.layers``), through a DDP wrapper."""
    inner = getattr(unwrap(model), "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(unwrap(model)).__name__} has no model.layers: not a decoder-only causal LM")
    return list(layers)


def decoder_stack(model: nn.Module) -> nn.Module:
    """The decoder (``model.model``: embedding, layers, final norm), through a DDP wrapper."""
    decoder_layers(model)  # refuses a model without model.layers
    stack = unwrap(model).model
    assert isinstance(stack, nn.Module)
    return stack


def plan_to_token(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The layer's keyword arguments with the microbatch's ``DACPPlan`` replaced by its token
    (worker/attention_op.py): what a layer compiled as one graph takes."""
    plan = kwargs.get(PLAN_KWARG)
    if plan is None:
        return kwargs
    out = {k: v for k, v in kwargs.items() if k != PLAN_KWARG}
    out[TOKEN_KWARG] = plan_token(plan)
    return out


def _stack_kwargs(stack: nn.Module) -> KwargsHook:
    """``plan_to_token``, refusing once, at the first forward, a stack sharded with FSDP2 ``fully_shard``:
    its per-layer hooks (unshard, reshard) would have to be traced into the one graph."""
    checked = False

    def prepare(kwargs: dict[str, Any]) -> dict[str, Any]:
        nonlocal checked
        if not checked:
            from torch.distributed.fsdp import FSDPModule

            if any(isinstance(m, FSDPModule) for m in stack.modules()):
                raise ValueError(
                    "compile='stack' with FSDP2 (fully_shard on the decoder layers): the whole stack cannot be one "
                    "graph around FSDP2's per-layer hooks; use compile='fullgraph' (one graph per layer)"
                )
            checked = True
        return plan_to_token(kwargs)

    return prepare


def compile_model(model: Any, *, compile: str | bool | None, device: torch.device) -> bool:
    """Compile ``model``'s decoder layers in place when ``compile`` says so; returns whether they are
    compiled. ``"auto"``/None: regional, on CUDA only; ``"fullgraph"``: each layer one graph with the
    attention as the registered operator ``skrull::dacp_attention``; ``"cudagraphs"``: that graph under CUDA
    graphs (CUDA only); ``"stack"``: the whole decoder (embedding, every layer, final norm) one graph, not
    under FSDP2. Works on a bare, DDP-wrapped or (but ``"stack"``) FSDP2-sharded model. A model's layers
    are compiled one way: asking for another is refused."""
    style = compile_style(compile, device)
    if style is None:
        return False
    layers = decoder_layers(model)
    stack = decoder_stack(model)
    existing = {compiled_style(module) for module in (*layers, stack)} - {None}
    if existing and existing != {style}:
        raise ValueError(f"compile={compile!r}: the decoder layers are already compiled {existing.pop()}")
    if style == STACK:
        compile_layers([stack], fullgraph=True, prepare_kwargs=_stack_kwargs(stack), style=STACK)
    elif style == FULLGRAPH:
        compile_layers(layers, fullgraph=True, prepare_kwargs=plan_to_token)
    elif style == CUDAGRAPHS:  # CUDA only (compile_style refuses it elsewhere); off unless asked for
        compile_layers(layers, fullgraph=True, prepare_kwargs=plan_to_token, **cudagraph_options())
    else:
        compile_layers(layers)
    return True


def compiled_how(model: Any) -> str:
    """``"compiled"`` (regional), ``"compiled, one graph per layer"`` or ``"compiled, one graph per layer,
    CUDA graphs"``, for the log line that says how the layers run; ``"eager"`` when they are not compiled."""
    if compiled_style(decoder_stack(model)) == STACK:
        return "compiled, the decoder stack one graph"
    styles = {compiled_style(layer) for layer in decoder_layers(model)}
    if styles == {FULLGRAPH}:
        return "compiled, one graph per layer"
    if styles == {CUDAGRAPHS}:
        return "compiled, one graph per layer, CUDA graphs"
    return "eager" if styles == {None} else "compiled"

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


def plan_to_token(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The layer's keyword arguments with the microbatch's ``DACPPlan`` replaced by its token
    (worker/attention_op.py): what a layer compiled as one graph takes."""
    plan = kwargs.get(PLAN_KWARG)
    if plan is None:
        return kwargs
    out = {k: v for k, v in kwargs.items() if k != PLAN_KWARG}
    out[TOKEN_KWARG] = plan_token(plan)
    return out


def compile_model(model: Any, *, compile: str | bool | None, device: torch.device) -> bool:
    """Compile ``model``'s decoder layers in place when ``compile`` says so; returns whether they are
    compiled. ``"auto"``/None: regional, on CUDA only; ``"fullgraph"``: each layer one graph with the
    attention as the registered operator ``skrull::dacp_attention``; ``"cudagraphs"``: that graph under CUDA
    graphs (CUDA only). Works on a bare, DDP-wrapped or FSDP2-sharded model. A model's layers are compiled
    one way: asking for another is refused."""
    style = compile_style(compile, device)
    if style is None:
        return False
    layers = decoder_layers(model)
    existing = {compiled_style(layer) for layer in layers} - {None}
    if existing and existing != {style}:
        raise ValueError(f"compile={compile!r}: the decoder layers are already compiled {existing.pop()}")
    if style == FULLGRAPH:
        compile_layers(layers, fullgraph=True, prepare_kwargs=plan_to_token)
    elif style == CUDAGRAPHS:  # CUDA only (compile_style refuses it elsewhere); off unless asked for
        compile_layers(layers, fullgraph=True, prepare_kwargs=plan_to_token, **cudagraph_options())
    else:
        compile_layers(layers)
    return True


def compiled_how(model: Any) -> str:
    """``"compiled"`` (regional), ``"compiled, one graph per layer"`` or ``"compiled, one graph per layer,
    CUDA graphs"``, for the log line that says how the layers run; ``"eager"`` when they are not compiled."""
    styles = {compiled_style(layer) for layer in decoder_layers(model)}
    if styles == {FULLGRAPH}:
        return "compiled, one graph per layer"
    if styles == {CUDAGRAPHS}:
        return "compiled, one graph per layer, CUDA graphs"
    return "eager" if styles == {None} else "compiled"

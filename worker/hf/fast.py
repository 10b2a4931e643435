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

from skrull.worker.compiling import compile_layers, resolve_compile


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


def compile_model(model: Any, *, compile: str | bool | None, device: torch.device) -> bool:
    """Compile ``model``'s decoder layers in place when ``compile`` says so (``"auto"``/None: on CUDA
    only); returns whether they are compiled. Works on a bare, DDP-wrapped or FSDP2-sharded model."""
    if not resolve_compile(compile, device):
        return False
    compile_layers(decoder_layers(model))
    return True

"""``compile`` choices resolve to one style each (CUDA graphs refused off CUDA), and a model's layers
are compiled one way: asking for another style later is refused."""

from __future__ import annotations

import pytest
import torch

from skrull.worker.compiling import (
    CUDAGRAPHS,
    FULLGRAPH,
    REGIONAL,
    STACK,
    compile_style,
    compiled_style,
    resolve_compile,
)
from skrull.worker.hf.fast import compile_model, compiled_how, decoder_layers, decoder_stack
from skrull.worker.hf.model import build_model
from tests.worker.hf.test_finetune import model_config

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_each_choice_resolves_to_its_style() -> None:
    assert compile_style("auto", CPU) is None and compile_style("auto", CUDA) == REGIONAL
    assert compile_style(None, CUDA) == REGIONAL and compile_style(True, CPU) == REGIONAL
    assert compile_style("on", CPU) == REGIONAL and compile_style("off", CUDA) is None
    assert compile_style(False, CUDA) is None
    assert compile_style("fullgraph", CPU) == FULLGRAPH and compile_style("stack", CPU) == STACK
    assert compile_style("cudagraphs", CUDA) == CUDAGRAPHS
    assert resolve_compile("fullgraph", CPU) and not resolve_compile("auto", CPU)


def test_cuda_graphs_off_cuda_and_unknown_choices_are_refused() -> None:
    with pytest.raises(ValueError, match="'cudagraphs' needs CUDA"):
        compile_style("cudagraphs", CPU)
    with pytest.raises(ValueError, match="'fast' is not one of auto, on, off, fullgraph, stack, cudagraphs"):
        compile_style("fast", CPU)


def test_a_model_is_compiled_one_way_and_says_how() -> None:
    model = build_model(model_config("qwen2-tiny"), seed=0, device=CPU)
    assert compiled_how(model) == "eager"
    assert compile_model(model, compile="fullgraph", device=CPU)
    assert {compiled_style(layer) for layer in decoder_layers(model)} == {FULLGRAPH}
    assert compiled_how(model) == "compiled, one graph per layer"
    assert compile_model(model, compile="fullgraph", device=CPU)  # idempotent
    for other in ("on", "stack"):
        with pytest.raises(ValueError, match="already compiled fullgraph"):
            compile_model(model, compile=other, device=CPU)
    stacked = build_model(model_config("qwen2-tiny"), seed=0, device=CPU)
    assert compile_model(stacked, compile="stack", device=CPU)
    assert compiled_style(decoder_stack(stacked)) == STACK
    assert compiled_how(stacked) == "compiled, the decoder stack one graph"
    with pytest.raises(ValueError, match="already compiled stack"):
        compile_model(stacked, compile="fullgraph", device=CPU)

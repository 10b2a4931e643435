"""A microbatch padded to a bucketed size (``pad_to_bucket``, for layers replayed as CUDA graphs) has the
loss and the gradients of the unpadded one: eager, and with the layers compiled as one graph each, over
two bucket sizes without recompiling."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from skrull.worker.compiling import compile_count
from skrull.worker.dacp import DACPPlan
from skrull.worker.dataloader import ready_microbatch
from skrull.worker.hf.fast import compile_model
from skrull.worker.hf.inputs import bucket_rows, model_inputs, pad_to_bucket
from skrull.worker.hf.model import build_model
from skrull.worker.hf.step import causal_lm_loss
from skrull.worker.inputs import SyntheticData
from skrull.worker.kernels import select_kernel
from skrull.worker.layout import MicrobatchLayout
from skrull.worker.loss import IGNORE_INDEX
from tests.worker.hf.test_finetune import model_config

CPU = torch.device("cpu")
CONFIG = model_config("qwen2-tiny")
TOLERANCE = 1e-5


def inputs(lengths: tuple[int, ...]) -> tuple[dict[str, Any], torch.Tensor]:
    layout = MicrobatchLayout(
        step=0, ranks=(0,), position=0, local_ids=tuple(range(len(lengths))), local_lengths=lengths, sharded=()
    )
    data = SyntheticData(seed=sum(lengths), lengths=lengths)
    vocab = int(CONFIG["vocab_size"])
    mb = ready_microbatch(layout, lambda i: data.lm_tokens(i, vocab), loss_normalizer=0, device=CPU)
    return model_inputs(mb, DACPPlan.build(layout, group=None, kernel=select_kernel(CPU, torch.float32), device=CPU))


def loss_and_grads(model: Any, kwargs: dict[str, Any], labels: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    num_targets = int((labels != IGNORE_INDEX).sum())
    loss = causal_lm_loss(model, kwargs, labels, num_targets=num_targets, loss_chunk_tokens=16)
    loss.backward()  # type: ignore[no-untyped-call]
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return float(loss.detach()), grads


def assert_same(got: tuple[float, dict[str, torch.Tensor]], want: tuple[float, dict[str, torch.Tensor]]) -> None:
    assert abs(got[0] - want[0]) <= TOLERANCE * abs(want[0])
    assert set(got[1]) == set(want[1])
    for name, g in want[1].items():
        err = float((got[1][name] - g).abs().max()) / float(g.abs().max())
        assert err <= TOLERANCE, (name, err)


def test_bucket_rows_picks_the_smallest_bucket_that_holds_the_microbatch() -> None:
    assert bucket_rows(33, (32, 64, 128)) == 64
    assert bucket_rows(64, (128, 64)) == 64
    with pytest.raises(ValueError, match="largest bucket 128"):
        bucket_rows(129, (64, 128))


def test_padding_rows_carry_token_0_position_0_and_no_target() -> None:
    kwargs, labels = inputs((7, 12))
    padded, padded_labels = pad_to_bucket(kwargs, labels, buckets=(32,))
    assert padded["input_ids"].shape == (1, 32) and padded_labels.shape == (32,)
    assert torch.equal(padded["input_ids"][0, :19], kwargs["input_ids"][0])
    assert not padded["input_ids"][0, 19:].any() and not padded["position_ids"][0, 19:].any()
    assert (padded_labels[19:] == IGNORE_INDEX).all() and torch.equal(padded_labels[:19], labels)


@pytest.mark.slow  # compiles the model: tens of seconds on 2 cores
def test_padding_to_a_bucket_changes_neither_loss_nor_gradients_eager_or_in_one_graph() -> None:
    eager = build_model(CONFIG, seed=0, device=CPU)
    fast = build_model(CONFIG, seed=0, device=CPU)
    assert compile_model(fast, compile="fullgraph", device=CPU)
    before = None
    for lengths, bucket in (((7, 12), 32), ((20, 5, 9, 1), 48), ((30,), 48)):
        kwargs, labels = inputs(lengths)
        want = loss_and_grads(eager, kwargs, labels)
        padded = pad_to_bucket(kwargs, labels, buckets=(bucket,))
        assert_same(loss_and_grads(eager, *padded), want)
        assert_same(loss_and_grads(fast, *padded), want)
        if before is None:
            before = compile_count()
    assert compile_count() == before  # a second bucket size compiles nothing new

"""The fused, chunked LM-head cross-entropy equals the plain one over the whole logits: loss and every
gradient (hidden states, head weight, bias), with ignored rows, in float32; its backend choice follows
what is installed."""

from __future__ import annotations

import pytest
import torch

from skrull.worker import fused_ce
from skrull.worker.fused_ce import linear_cross_entropy_sum


def _inputs(bias: bool) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(37, 16, generator=gen, dtype=torch.float64).float().requires_grad_(True)
    weight = (torch.randn(50, 16, generator=gen) * 0.3).requires_grad_(True)
    b = (torch.randn(50, generator=gen) * 0.1).requires_grad_(True) if bias else None
    labels = torch.randint(0, 50, (37,), generator=gen)
    labels[[0, 5, 36]] = -100
    return hidden, weight, b, labels  # type: ignore[return-value]


@pytest.mark.parametrize("chunk", [1, 8, 37, 100])
@pytest.mark.parametrize("bias", [False, True])
def test_chunked_fused_loss_and_gradients_equal_the_whole_logits(chunk: int, bias: bool) -> None:
    hidden, weight, b, labels = _inputs(bias)
    want = torch.nn.functional.cross_entropy(
        torch.nn.functional.linear(hidden, weight, b), labels, ignore_index=-100, reduction="sum"
    )
    want_grads = torch.autograd.grad(want * 0.25, [t for t in (hidden, weight, b) if t is not None])
    got = linear_cross_entropy_sum(hidden, weight, labels, bias=b, chunk_tokens=chunk, backend="torch")
    got_grads = torch.autograd.grad(got * 0.25, [t for t in (hidden, weight, b) if t is not None])
    assert got.dtype == torch.float32
    assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-6)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("chunk", [1, 8, 100])
def test_a_final_logit_softcap_is_taken_as_gemma2_takes_it(chunk: int) -> None:
    """Gemma 2's ``final_logit_softcapping``: the loss of ``c tanh(z / c)``, loss and every gradient."""
    hidden, weight, b, labels = _inputs(True)
    cap = 0.7  # small against the logits' spread: the tanh bends, so a missing chain-rule factor shows
    logits = torch.nn.functional.linear(hidden, weight, b)
    want = torch.nn.functional.cross_entropy(cap * torch.tanh(logits / cap), labels, reduction="sum")
    want_grads = torch.autograd.grad(want, [hidden, weight, b])
    got = linear_cross_entropy_sum(hidden, weight, labels, bias=b, chunk_tokens=chunk, backend="torch", softcap=cap)
    got_grads = torch.autograd.grad(got, [hidden, weight, b])
    assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-6)
    plain = linear_cross_entropy_sum(hidden, weight, labels, bias=b, chunk_tokens=chunk, backend="torch")
    assert abs(float(plain.detach()) - float(want.detach())) > 1e-2 * abs(float(want.detach()))
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_a_softcap_that_is_not_positive_is_refused() -> None:
    hidden, weight, _, labels = _inputs(False)
    with pytest.raises(ValueError, match="softcap must be a number > 0"):
        linear_cross_entropy_sum(hidden, weight, labels, softcap=0.0)


def test_rows_all_ignored_give_zero_loss_and_zero_gradient() -> None:
    hidden, weight, _, labels = _inputs(False)
    labels[:] = -100
    got = linear_cross_entropy_sum(hidden, weight, labels, chunk_tokens=8)
    got.backward()
    assert float(got.detach()) == 0.0
    assert hidden.grad is not None and float(hidden.grad.abs().max()) == 0.0


def test_backend_is_liger_only_on_cuda_with_liger_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(fused_ce, "_liger", lambda: None)
    assert fused_ce.resolve_backend("auto", cuda) == "torch"
    with pytest.raises(ValueError, match="liger"):
        fused_ce.resolve_backend("liger", cuda)
    monkeypatch.setattr(fused_ce, "_liger", lambda: object())
    assert fused_ce.resolve_backend("auto", cuda) == "liger"
    assert fused_ce.resolve_backend("auto", cpu) == "torch"
    with pytest.raises(ValueError, match="one of"):
        fused_ce.resolve_backend("triton", cpu)

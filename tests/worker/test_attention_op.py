"""The DACP attention as a registered operator (worker/attention_op.py), one process: it equals the eager
DACP attention (outputs and gradients, with soft-capping and sliding windows), padding rows get zero,
microbatches in flight each find their own plan, a dropped plan is refused, the operator passes
``torch.library.opcheck``, and it traces into one graph that does not recompile over token counts."""

from __future__ import annotations

import pytest
import torch

from skrull.worker import attention_op
from skrull.worker.compiling import compile_count
from skrull.worker.dacp import DACPPlan, dacp_attention
from skrull.worker.kernels import select_kernel
from skrull.worker.layout import MicrobatchLayout

CPU = torch.device("cpu")
KERNEL = select_kernel(CPU, torch.float32)
HEADS, KV_HEADS, DIM = 4, 2, 8


def plan_of(lengths: tuple[int, ...]) -> DACPPlan:
    layout = MicrobatchLayout(
        step=0, ranks=(0,), position=0, local_ids=tuple(range(len(lengths))), local_lengths=lengths, sharded=()
    )
    return DACPPlan.build(layout, group=None, kernel=KERNEL, device=CPU)


QKV = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def qkv(rows: int, seed: int) -> QKV:
    gen = torch.Generator().manual_seed(seed)

    def draw(heads: int) -> torch.Tensor:
        return torch.randn(rows, heads, DIM, generator=gen, dtype=torch.float64).requires_grad_(True)

    return draw(HEADS), draw(KV_HEADS), draw(KV_HEADS)


def grads(out: torch.Tensor, inputs: tuple[torch.Tensor, ...], seed: int) -> tuple[torch.Tensor, ...]:
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return torch.autograd.grad((out * weight).sum(), inputs)


@pytest.mark.parametrize(("softcap", "window"), [(None, None), (5.0, None), (None, 6), (3.0, 4)])
def test_the_operator_equals_the_eager_dacp_attention(softcap: float | None, window: int | None) -> None:
    plan = plan_of((7, 12, 1, 9))
    q, k, v = qkv(29, seed=1)
    want = dacp_attention(q, k, v, plan, softcap=softcap, window=window)
    got = attention_op.attention(q, k, v, attention_op.plan_token(plan), softcap=softcap, window=window)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads(got, (q, k, v), 2), grads(want, (q, k, v), 2), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_padding_rows_get_zero_output_and_pass_no_gradient() -> None:
    plan = plan_of((5, 6))
    q, k, v = qkv(16, seed=3)  # 11 rows of the layout, 5 padding rows
    out = attention_op.attention(q, k, v, attention_op.plan_token(plan))
    assert torch.equal(out[11:], torch.zeros_like(out[11:]))
    dq, dk, dv = grads(out, (q, k, v), 4)
    for g in (dq, dk, dv):
        assert torch.equal(g[11:], torch.zeros_like(g[11:]))
    want = dacp_attention(q[:11], k[:11], v[:11], plan)
    torch.testing.assert_close(out[:11], want, rtol=1e-12, atol=1e-12)


def test_microbatches_in_flight_each_find_their_own_plan() -> None:
    plans = (plan_of((4, 9)), plan_of((13,)))
    inputs = (qkv(13, seed=5), qkv(13, seed=6))
    outs = [attention_op.attention(*x, attention_op.plan_token(p)) for p, x in zip(plans, inputs, strict=True)]
    # both forwards ran before either backward: each backward still uses its own plan
    for p, x, out in zip(plans, inputs, outs, strict=True):
        want = dacp_attention(*x, p)
        for a, b in zip(grads(out, x, 7), grads(want, x, 7), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(outs[0], dacp_attention(*inputs[0], plans[1]))  # the plans do differ


def test_a_plan_no_longer_registered_is_refused() -> None:
    plan = plan_of((6, 6))
    q, k, v = qkv(12, seed=8)
    out = attention_op.attention(q, k, v, attention_op.plan_token(plan))
    attention_op.clear_plans()
    with pytest.raises(LookupError, match="no longer registered"):
        out.sum().backward()  # type: ignore[no-untyped-call]
    with pytest.raises(LookupError, match="no longer registered"):
        attention_op.attention(q, k, v, torch.zeros(1, dtype=torch.int64))


def test_a_registered_plan_keeps_its_token_and_the_registry_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    attention_op.clear_plans()
    plan = plan_of((3,))
    token = attention_op.plan_token(plan)
    assert attention_op.plan_token(plan) is token and attention_op.plan_of(token) is plan
    monkeypatch.setattr(attention_op, "REGISTRY_SIZE", 3)
    others = [plan_of((n,)) for n in (4, 5, 6)]
    tokens = [attention_op.plan_token(p) for p in others]
    assert attention_op.registered_plans() == 3
    with pytest.raises(LookupError):
        attention_op.plan_of(token)  # the oldest was dropped
    assert attention_op.plan_of(tokens[-1]) is others[-1]


def test_the_operator_passes_opcheck() -> None:
    plan = plan_of((5, 8))
    q, k, v = (t.detach().float().requires_grad_(True) for t in qkv(13, seed=9))
    token = attention_op.plan_token(plan)
    torch.library.opcheck(torch.ops.skrull.dacp_attention.default, (q, k, v, token, 0.0, 0))
    torch.library.opcheck(torch.ops.skrull.dacp_attention.default, (q, k, v, token, 4.0, 3))


def test_the_operator_traces_into_one_graph_that_keeps_over_token_counts() -> None:
    torch._dynamo.reset()

    def layer(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        return attention_op.attention(torch.tanh(q), k * 2, v, token, window=5).square()

    compiled = torch.compile(layer, fullgraph=True, dynamic=True, backend="aot_eager")
    before = None
    for lengths in ((5, 8), (3, 3, 11), (20,), (2, 9, 4, 6)):
        plan = plan_of(lengths)
        token = attention_op.plan_token(plan)
        x = qkv(sum(lengths), seed=sum(lengths))
        got = compiled(*x, token)
        want = layer(*x, token)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        for a, b in zip(grads(got, x, 1), grads(want, x, 1), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        if before is None:
            before = compile_count()  # after the first token count: the warm-up
    assert compile_count() == before

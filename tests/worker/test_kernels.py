"""The attention adapter: every backend gives dense causal attention per segment, GQA and key prefixes."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from skrull.solver.errors import RequestError
from skrull.worker.kernels import available_kernels, select_kernel

CPU = torch.device("cpu")


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_len: int, k_len: int) -> torch.Tensor:
    """Textbook attention for one segment, float64, bottom-right causal mask."""
    rep = q.shape[1] // k.shape[1]
    out = torch.zeros(q_len, q.shape[1], v.shape[2], dtype=torch.float64)
    for h in range(q.shape[1]):
        scores = q[:, h].double() @ k[:, h // rep].double().T / math.sqrt(q.shape[2])
        for i in range(q_len):
            visible = scores[i, : i + k_len - q_len + 1]
            if visible.numel():
                out[i, h] = torch.softmax(visible, dim=0) @ v[: visible.numel(), h // rep].double()
    return out


def cumsum(values: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(values).cumsum(0).tolist()] if values else [0], dtype=torch.int32)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 9), st.integers(0, 12)), min_size=1, max_size=4),
    st.sampled_from([(4, 4), (4, 2), (6, 1)]),
    st.sampled_from(["reference", "sdpa"]),
)
def test_varlen_matches_dense_attention_per_segment(
    segments: list[tuple[int, int]], heads: tuple[int, int], name: str
) -> None:
    # key length >= query length: a shard piece [a, b) attends to keys 0..b-1
    segments = [(q_len, q_len + extra) for q_len, extra in segments]
    h, h_kv = heads
    gen = torch.Generator().manual_seed(len(segments) * 31 + h)
    q = torch.randn(sum(s for s, _ in segments), h, 8, generator=gen)
    k = torch.randn(sum(s for _, s in segments), h_kv, 8, generator=gen)
    v = torch.randn(sum(s for _, s in segments), h_kv, 8, generator=gen)
    kernel = select_kernel(CPU, torch.float32, name)
    out = kernel(
        q,
        k,
        v,
        cu_seqlens_q=cumsum([s for s, _ in segments]),
        cu_seqlens_k=cumsum([s for _, s in segments]),
        max_seqlen_q=max(s for s, _ in segments),
        max_seqlen_k=max(s for _, s in segments),
    )
    qo = ko = 0
    for q_len, k_len in segments:
        want = dense_attention(q[qo : qo + q_len], k[ko : ko + k_len], v[ko : ko + k_len], q_len, k_len)
        assert torch.allclose(out[qo : qo + q_len].double(), want, atol=1e-5)
        qo, ko = qo + q_len, ko + k_len


def test_reference_and_sdpa_agree_on_gradients_with_gqa() -> None:
    gen = torch.Generator().manual_seed(0)
    q0 = torch.randn(23, 4, 8, generator=gen)
    k0 = torch.randn(31, 2, 8, generator=gen)
    v0 = torch.randn(31, 2, 8, generator=gen)
    upstream = torch.randn(23, 4, 8, generator=gen)
    cu_q, cu_k = cumsum([10, 13]), cumsum([10, 21])
    grads = []
    for name in ("reference", "sdpa"):
        q, k, v = (t.clone().requires_grad_(True) for t in (q0, k0, v0))
        out = select_kernel(CPU, torch.float32, name)(
            q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=13, max_seqlen_k=21
        )
        out.backward(upstream)
        grads.append([t.grad for t in (q, k, v)])
    for a, b in zip(*grads, strict=True):
        assert a is not None and b is not None
        assert torch.allclose(a, b, atol=1e-5)


def test_reference_blocks_long_queries_without_changing_results(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(40, 2, 4, generator=gen) for _ in range(3))
    cu = cumsum([40])
    kernel = select_kernel(CPU, torch.float32, "reference")
    whole = kernel(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=40, max_seqlen_k=40)
    monkeypatch.setattr("skrull.worker.kernels.REFERENCE_BLOCK_ROWS", 7)
    blocked = kernel(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=40, max_seqlen_k=40)
    assert torch.equal(whole, blocked)


def test_cpu_prefers_the_reference_and_refuses_gpu_kernels() -> None:
    assert available_kernels(CPU, torch.float32)[0] == "reference"
    assert select_kernel(CPU, torch.float32).name == "reference"
    with pytest.raises(RequestError, match="kernel: 'torch-varlen': not usable"):
        select_kernel(CPU, torch.float32, "torch-varlen")
    with pytest.raises(RequestError, match="unknown attention kernel"):
        select_kernel(CPU, torch.float32, "magic")


def test_query_heads_must_be_a_multiple_of_kv_heads() -> None:
    kernel = select_kernel(CPU, torch.float32)
    q, k = torch.zeros(3, 3, 4), torch.zeros(3, 2, 4)
    cu = cumsum([3])
    with pytest.raises(ValueError, match="multiple"):
        kernel(q, k, k, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=3, max_seqlen_k=3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_kernels_match_the_reference_in_bf16() -> None:
    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(300, 8, 64, generator=gen)
    k = torch.randn(420, 2, 64, generator=gen)
    v = torch.randn(420, 2, 64, generator=gen)
    cu_q, cu_k = cumsum([100, 200]), cumsum([100, 320])
    want = select_kernel(CPU, torch.float32, "reference")(
        q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=200, max_seqlen_k=320
    )
    for name in available_kernels(device, torch.bfloat16):
        kernel = select_kernel(device, torch.bfloat16, name)
        got = kernel(
            *(t.to(device, torch.bfloat16) for t in (q, k, v)),
            cu_seqlens_q=cu_q.to(device),
            cu_seqlens_k=cu_k.to(device),
            max_seqlen_q=200,
            max_seqlen_k=320,
        )
        assert torch.allclose(got.float().cpu(), want, atol=3e-2), name


# --- backend choice by what imports (no GPU needed: imports, capability and trial stand in) ------------
class _FakeModule:
    def __init__(self, **attrs: object) -> None:
        self.__dict__.update(attrs)


def _installed(monkeypatch: pytest.MonkeyPatch, modules: dict[str, object], capability: tuple[int, int]) -> None:
    from skrull.worker import kernels

    def fake_import(name: str) -> object:
        if name in modules:
            return modules[name]
        raise ImportError(name)

    monkeypatch.setattr(kernels, "_import", fake_import)
    monkeypatch.setattr(kernels, "_capability", lambda device: capability)
    monkeypatch.setattr(kernels, "trial_error", lambda kernel, device, dtype: None)


def _varlen(*args: object, **kwargs: object) -> torch.Tensor:
    return torch.zeros(1)


CUDA = torch.device("cuda", 0)


def test_flash_attn_4_is_chosen_on_hopper_when_it_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    from skrull.worker.kernels import choose_kernel

    _installed(monkeypatch, {"flash_attn.cute": _FakeModule(flash_attn_varlen_func=_varlen)}, (9, 0))
    choice = choose_kernel(CUDA, torch.bfloat16)
    assert choice.kernel.name == "flash-attn-4"
    assert choice.describe() == "attention kernel: flash-attn-4 (best usable)"


def test_without_flash_attn_4_on_ampere_flash_attn_2_is_chosen_and_the_line_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from skrull.worker.kernels import choose_kernel

    modules = {
        "flash_attn.cute": _FakeModule(flash_attn_varlen_func=_varlen),
        "flash_attn": _FakeModule(flash_attn_varlen_func=_varlen),
    }
    _installed(monkeypatch, modules, (8, 0))
    choice = choose_kernel(CUDA, torch.bfloat16)
    assert choice.kernel.name == "flash-attn"
    assert "flash-attn-4 (needs sm90 or sm100, this GPU is sm80)" in choice.describe()


def test_nothing_installed_falls_back_to_torch_varlen_and_float32_to_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    from skrull.worker.kernels import _torch_varlen, choose_kernel

    _installed(monkeypatch, {}, (9, 0))
    choice = choose_kernel(CUDA, torch.bfloat16)
    want = "torch-varlen" if _torch_varlen() is not None else "sdpa"
    assert choice.kernel.name == want
    assert "flash-attn-4 (flash_attn.cute does not import" in choice.describe()
    assert "flash-attn (flash_attn (2) is not installed)" in choice.describe()
    assert choose_kernel(CUDA, torch.float32).kernel.name == "sdpa"


def test_a_backend_whose_trial_call_fails_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    from skrull.worker import kernels

    _installed(monkeypatch, {"flash_attn.cute": _FakeModule(flash_attn_varlen_func=_varlen)}, (10, 0))
    monkeypatch.setattr(
        kernels, "trial_error", lambda kernel, d, t: "trial call failed" if kernel.name == "flash-attn-4" else None
    )
    choice = kernels.choose_kernel(CUDA, torch.bfloat16)
    assert choice.kernel.name != "flash-attn-4"
    assert "flash-attn-4 (trial call failed)" in choice.describe()


def test_the_trial_call_accepts_the_reference_and_catches_a_top_left_causal_mask() -> None:
    from skrull.worker.kernels import AttentionKernel, _reference, _sdpa, trial_error

    assert trial_error(AttentionKernel(name="reference", fn=_reference), CPU, torch.float32) is None

    def top_left(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale):  # type: ignore[no-untyped-def]
        # masks each segment from the top left: wrong for a shard piece's longer key prefix
        outs = []
        for i in range(len(cu_q) - 1):
            a, b, c, d = int(cu_q[i]), int(cu_q[i + 1]), int(cu_k[i]), int(cu_k[i + 1])
            qi, ki, vi = (t.transpose(0, 1).unsqueeze(0) for t in (q[a:b], k[c:d], v[c:d]))
            mask = torch.ones(b - a, d - c, dtype=torch.bool).tril()
            o = torch.nn.functional.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, enable_gqa=True)
            outs.append(o.squeeze(0).transpose(0, 1))
        return torch.cat(outs)

    error = trial_error(AttentionKernel(name="bad", fn=top_left), CPU, torch.float32)
    assert error is not None and "disagrees" in error
    assert trial_error(AttentionKernel(name="sdpa", fn=_sdpa), CPU, torch.float32) is None


def dense_features(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_len: int, k_len: int, softcap: float | None, window: int | None
) -> torch.Tensor:
    """Eager attention as Gemma 2 / Mistral write it: scores * scale, softcap, causal (and window) mask,
    softmax; the query of row i sits at key position i + k_len - q_len."""
    rep = q.shape[1] // k.shape[1]
    out = torch.zeros(q_len, q.shape[1], v.shape[2], dtype=torch.float64)
    for h in range(q.shape[1]):
        scores = q[:, h].double() @ k[:, h // rep].double().T / math.sqrt(q.shape[2])
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        for i in range(q_len):
            p = i + k_len - q_len
            lo = 0 if window is None else max(0, p - window + 1)
            out[i, h] = torch.softmax(scores[i, lo : p + 1], dim=0) @ v[lo : p + 1, h // rep].double()
    return out


@pytest.mark.parametrize("name", ["reference", "sdpa"])
@pytest.mark.parametrize(("softcap", "window"), [(2.0, None), (None, 3), (1.5, 4)])
def test_softcap_and_sliding_window_match_eager_attention_on_key_prefixes(
    name: str, softcap: float | None, window: int | None
) -> None:
    # a whole sequence (7, 7) and a shard piece's queries on their key prefix (5 of 12): the piece's
    # queries sit at positions 7..11, where the window and the softcap must act as on the whole sequence
    segments = [(7, 7), (5, 12)]
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(12, 4, 8, generator=gen) * 3  # large scores, so that the softcap matters
    k = torch.randn(19, 2, 8, generator=gen) * 3
    v = torch.randn(19, 2, 8, generator=gen)
    kernel = select_kernel(CPU, torch.float32, name)
    out = kernel(
        q, k, v, cu_seqlens_q=cumsum([7, 5]), cu_seqlens_k=cumsum([7, 12]), max_seqlen_q=7, max_seqlen_k=12,
        softcap=softcap, window=window,
    )  # fmt: skip
    plain = kernel(q, k, v, cu_seqlens_q=cumsum([7, 5]), cu_seqlens_k=cumsum([7, 12]), max_seqlen_q=7, max_seqlen_k=12)
    assert not torch.allclose(out, plain, atol=1e-3)  # the feature changes the result
    qo = ko = 0
    for q_len, k_len in segments:
        want = dense_features(q[qo : qo + q_len], k[ko : ko + k_len], v[ko : ko + k_len], q_len, k_len, softcap, window)
        assert torch.allclose(out[qo : qo + q_len].double(), want, atol=1e-5)
        qo, ko = qo + q_len, ko + k_len

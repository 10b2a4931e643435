"""DACP as a transformers attention implementation, in one process: packed microbatches of local
sequences give each sequence's own logits, the chunked loss equals the plain one, and misuse is refused
with a clear error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from skrull.solver.errors import RequestError
from skrull.worker.dacp import DACPPlan
from skrull.worker.dataloader import ready_microbatch
from skrull.worker.hf.attention import ATTN_IMPLEMENTATION
from skrull.worker.hf.inputs import model_inputs
from skrull.worker.hf.model import build_model, check_model_config
from skrull.worker.hf.step import causal_lm_loss
from skrull.worker.inputs import SyntheticData
from skrull.worker.kernels import select_kernel
from skrull.worker.layout import MicrobatchLayout

MODELS = Path(__file__).resolve().parents[3] / "examples" / "models"
LENGTHS = (7, 1, 12, 5)


def config(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((MODELS / f"{name}.json").read_text())
    return doc


def local_layout(ids: tuple[int, ...]) -> MicrobatchLayout:
    return MicrobatchLayout(
        step=0, ranks=(0,), position=0, local_ids=ids, local_lengths=tuple(LENGTHS[i] for i in ids), sharded=()
    )


def packed(model: Any, ids: tuple[int, ...]) -> tuple[dict[str, Any], torch.Tensor]:
    data = SyntheticData(seed=2, lengths=LENGTHS)
    layout = local_layout(ids)
    mb = ready_microbatch(layout, lambda i: data.lm_tokens(i, 128), loss_normalizer=0, device=torch.device("cpu"))
    plan = DACPPlan.build(
        layout, group=None, kernel=select_kernel(torch.device("cpu"), torch.float32), device=torch.device("cpu")
    )
    return model_inputs(mb, plan)


@pytest.mark.parametrize("name", ["qwen2-tiny", "llama-tiny"])
def test_packed_local_sequences_give_each_sequences_own_logits(name: str) -> None:
    model = build_model(config(name), seed=4)
    assert model.config._attn_implementation == ATTN_IMPLEMENTATION
    plain = build_model(config(name), seed=4, attn_implementation="eager")
    data = SyntheticData(seed=2, lengths=LENGTHS)
    kwargs, labels = packed(model, (0, 1, 2, 3))
    with torch.no_grad():
        got = model(**kwargs).logits[0]
        start = 0
        for i, n in enumerate(LENGTHS):
            want = plain(input_ids=data.lm_tokens(i, 128)[0].unsqueeze(0), use_cache=False).logits[0]
            assert torch.allclose(got[start : start + n], want, rtol=1e-5, atol=1e-5)
            start += n
    assert int((labels != -100).sum()) == sum(n - 1 for n in LENGTHS)


def test_chunked_loss_equals_the_whole_loss_and_its_gradients() -> None:
    grads = []
    losses = []
    for chunk in (None, 5):
        model = build_model(config("qwen2-tiny"), seed=4)
        kwargs, labels = packed(model, (2, 0, 3))
        loss = causal_lm_loss(model, kwargs, labels, num_targets=17, loss_chunk_tokens=chunk)
        loss.backward()
        losses.append(float(loss.detach()))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    for name, g in grads[0].items():
        assert torch.allclose(g, grads[1][name], rtol=1e-5, atol=1e-7), name


def test_a_member_without_tokens_runs_one_ignored_padding_row() -> None:
    model = build_model(config("llama-tiny"), seed=4)
    kwargs, labels = packed(model, ())
    assert kwargs["input_ids"].shape == (1, 1) and labels.tolist() == [-100]
    out = model(**kwargs).logits
    assert out.shape == (1, 1, 128)


def test_a_forward_without_the_plan_is_refused() -> None:
    model = build_model(config("qwen2-tiny"), seed=4)
    with pytest.raises(ValueError, match="skrull_dacp=<DACPPlan>"):
        model(input_ids=torch.zeros(1, 4, dtype=torch.long), use_cache=False)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "gpt2"}, "model_type: 'gpt2': unsupported"),
        ({"sliding_window": 0}, "sliding_window: 0: must be an integer >= 1 or null"),
        ({"attention_chunk_size": 8}, "attention_chunk_size: 8: an attention feature the DACP attention does not"),
        ({"num_key_value_heads": 3}, "num_key_value_heads: 3: must divide num_attention_heads (4)"),
        ({"attention_dropout": 0.1}, "attention_dropout: 0.1: must be 0"),
        ({"hidden_size": -1}, "hidden_size: -1: must be an integer in 1..2147483647"),
        ({"vocab_size": 10**30}, "vocab_size: 1000000000000000000000000000000: must be an integer in 1.."),
        ({"num_hidden_layers": 2.5}, "num_hidden_layers: 2.5: must be an integer"),
        ({"num_attention_heads": True}, "num_attention_heads: True: must be an integer"),
        ({"hidden_size": 66}, "hidden_size: 66: must be a multiple of num_attention_heads (4)"),
        ({"head_dim": 7}, "head_dim: 7: must be an even integer >= 2"),
        ({"head_dim": "16"}, "head_dim: '16': must be an even integer"),
    ],
)
def test_configs_that_cannot_run_under_dacp_are_refused(change: dict[str, Any], message: str) -> None:
    doc = {**config("qwen2-tiny"), **change}
    with pytest.raises(RequestError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_model_config(doc)


def test_a_non_default_scaling_is_applied_like_eager_attention() -> None:
    """Models whose layers scale scores by other than 1/sqrt(head_dim) get exactly that scaling."""
    from transformers.models.qwen2.modeling_qwen2 import eager_attention_forward

    from skrull.worker.hf.attention import dacp_attention_forward

    gen = torch.Generator().manual_seed(0)
    layout = local_layout((3, 0))  # rows 0..4 and 5..11: two sequences of 5 and 7 tokens (LENGTHS[3], [0])
    q, k, v = (torch.randn(1, h, 12, 8, generator=gen) for h in (4, 2, 2))
    plan = DACPPlan.build(
        layout, group=None, kernel=select_kernel(torch.device("cpu"), torch.float32), device=torch.device("cpu")
    )

    class Layer(torch.nn.Module):
        num_key_value_groups = 2
        training = False

    got, _ = dacp_attention_forward(Layer(), q, k, v, None, scaling=0.7, skrull_dacp=plan)
    for a, b in ((0, 5), (5, 12)):
        mask = torch.full((b - a, b - a), float("-inf")).triu(1)[None, None]
        want, _ = eager_attention_forward(Layer(), q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], mask, scaling=0.7)
        assert torch.allclose(got[:, a:b], want, atol=1e-6)


GEMMA2 = {
    "model_type": "gemma2", "vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 256,
    "attn_logit_softcapping": 0.5, "final_logit_softcapping": 3.0, "sliding_window": 4, "query_pre_attn_scalar": 12,
    "attention_dropout": 0.0, "tie_word_embeddings": True, "initializer_range": 0.5,
}  # fmt: skip


def test_gemma2_softcapping_and_sliding_window_give_each_sequences_own_logits() -> None:
    """A Gemma 2 whose scores are soft-capped (small cap: it bites) and whose local layers see 4 keys: the packed
    DACP forward gives each sequence the logits of the model's own eager attention on it alone."""
    model = build_model(GEMMA2, seed=1)
    reference = build_model(GEMMA2, seed=1, attn_implementation="eager")
    kwargs, _ = packed(model, (0, 2, 3))
    logits = model(**kwargs).logits[0]
    start = 0
    for i in (0, 2, 3):
        ids = kwargs["input_ids"][:, start : start + LENGTHS[i]]
        want = reference(input_ids=ids, use_cache=False).logits[0]
        assert torch.allclose(logits[start : start + LENGTHS[i]], want, atol=1e-5), i
        start += LENGTHS[i]
    softless = build_model({**GEMMA2, "attn_logit_softcapping": None}, seed=1)
    assert not torch.allclose(softless(**kwargs).logits[0], logits, atol=1e-4)  # the cap changes the logits

"""On CUDA GPUs (``pytest -m gpu``, part of ``make gpu-check``): DACP attention in bf16 with the best
kernel (flash-attn varlen when installed) gives each packed sequence its own logits, and training under
plans over NCCL equals the plain step (float32: 1e-3; bf16 with flash-attn: within bf16 noise)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from skrull.solver.planning import solve
from skrull.solver.types import Problem
from skrull.worker.dacp import DACPPlan
from skrull.worker.dataloader import ready_microbatch
from skrull.worker.hf.finetune import FinetuneConfig, check_steps, finetune_plan
from skrull.worker.hf.inputs import model_inputs
from skrull.worker.hf.model import build_model
from skrull.worker.inputs import SyntheticData
from skrull.worker.kernels import select_kernel
from skrull.worker.layout import MicrobatchLayout
from tests.conftest import make_request

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

MODELS = Path(__file__).resolve().parents[3] / "examples" / "models"
LENGTHS = (300, 17, 1025, 64)


def config(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((MODELS / f"{name}.json").read_text())
    return doc


@pytest.mark.parametrize("name", ["qwen2-tiny", "llama-tiny"])
def test_bf16_packed_sequences_give_each_sequences_own_logits(name: str) -> None:
    device = torch.device("cuda")
    model = build_model(config(name), seed=1, device=device, dtype=torch.bfloat16)
    plain = build_model(config(name), seed=1, device=device, dtype=torch.bfloat16, attn_implementation="sdpa")
    kernel = select_kernel(device, torch.bfloat16)
    data = SyntheticData(seed=2, lengths=LENGTHS)
    layout = MicrobatchLayout(step=0, ranks=(0,), position=0, local_ids=(0, 1, 2, 3), local_lengths=LENGTHS, sharded=())
    mb = ready_microbatch(layout, lambda i: data.lm_tokens(i, 128), loss_normalizer=0, device=device)
    kwargs, _ = model_inputs(mb, DACPPlan.build(layout, group=None, kernel=kernel, device=device))
    with torch.no_grad():
        got = model(**kwargs).logits[0].float()
        start = 0
        for i, n in enumerate(LENGTHS):
            ids = data.lm_tokens(i, 128)[0].to(device).unsqueeze(0)
            want = plain(input_ids=ids, use_cache=False).logits[0].float()
            assert torch.allclose(got[start : start + n], want, atol=5e-2, rtol=5e-2), (kernel.name, i)
            start += n


def _nccl_run(dtype: str, tolerance_loss: float, tolerance_grad: float) -> None:
    world = min(torch.cuda.device_count(), 4)
    if world < 2:
        pytest.skip("needs 2 GPUs for context parallelism over NCCL")
    request = make_request([[700, 40, 1500, 9, 300, 2000, 77, 260]], dp=1, cp=world, bucket=1024)
    plan = solve(request)
    assert any(mb.sharded for it in plan.iterations for mb in it.microbatches)
    lengths = Problem.from_request(request).lengths
    cfg = FinetuneConfig(model_config=config("qwen2-tiny"), steps=2, seed=3, dtype=dtype, record_grads=True)
    result = finetune_plan(plan, lengths, world_size=world, backend="nccl", config=cfg)
    for c in check_steps(plan, lengths, result, config=cfg):
        assert c.loss_rel_error <= tolerance_loss, c
        assert c.worst_grad[1] <= tolerance_grad, c


def test_float32_training_over_nccl_equals_the_plain_step() -> None:
    _nccl_run("float32", 1e-3, 1e-3)


def test_bf16_flash_attention_training_stays_near_the_float32_plain_step() -> None:
    _nccl_run("bfloat16", 2e-2, 1e-1)

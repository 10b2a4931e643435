"""A representative subset of the conformance matrix (tests/conformance/matrix.py) in ``make test``: the
cells that exercise what went silently wrong before (Gemma 2's soft-capping and sliding window over
sharded sequences, Llama's single K/V head with tied embeddings under FSDP2 and under TRL with
assistant-only targets, Mistral's sliding window under DDP across DP and CP, a mixture of experts under FSDP2,
and its router loss refused by default and trained per microbatch when asked): one cell per integration,
about a minute each on the shared 2-core machine under a load of about 10 (less idle). The whole matrix
runs in ``make conformance`` (docs/integrations/conformance.md gives every cell's figure). Two cells run
with activation checkpointing on (``--activation-checkpointing`` of the scripts)."""

from __future__ import annotations

import pytest

from tests.conformance.matrix import TOLERANCE, run_cell


@pytest.mark.parametrize(
    ("arch", "dp", "cp", "integration"),
    [
        ("gemma2-softcap", 1, 4, "trainer"),
        ("llama-1kv-tied", 2, 2, "fsdp"),
        ("mistral-window", 2, 2, "ddp"),
        ("llama-1kv-tied", 2, 2, "trl"),
        ("qwen2-moe", 2, 2, "fsdp"),  # a mixture of experts, the router's auxiliary loss off
    ],
)
def test_the_first_step_equals_the_plain_step(arch: str, dp: int, cp: int, integration: str) -> None:
    cell = run_cell(arch, dp, cp, integration, timeout_s=600)
    assert cell.outcome == "pass", cell
    assert float(cell.detail) <= TOLERANCE


@pytest.mark.parametrize(
    ("arch", "dp", "cp", "integration"),
    [
        ("llama-1kv-tied", 1, 4, "ddp"),  # found hanging: a recomputation inside the attention's backward
        ("gemma2-softcap", 2, 2, "trl"),  # TRL's default is checkpointing on
    ],
)
def test_the_first_step_with_activation_checkpointing_equals_the_plain_step(
    arch: str, dp: int, cp: int, integration: str
) -> None:
    cell = run_cell(arch, dp, cp, integration, timeout_s=600, checkpointing=True)
    assert cell.outcome == "pass", cell
    assert float(cell.detail) <= TOLERANCE


def test_the_routers_auxiliary_loss_is_refused_before_the_first_step() -> None:
    """Found: Qwen2-MoE with output_router_logits=True, loss 9.68 against the plain step's 6.51 under an own
    FSDP2 loop at DP2xCP2; the statistics of the plain step's load-balancing loss span the global batch."""
    cell = run_cell("qwen2-moe-router-aux", 2, 2, "ddp", timeout_s=600)
    assert cell.outcome == "refused", cell
    assert "output_router_logits" in cell.detail


def test_the_per_microbatch_router_loss_equals_the_plain_step_over_the_same_microbatches() -> None:
    """``--router-aux-loss per-microbatch``: the router's load-balancing loss of each of the plan's
    microbatches, against a plain step that adds Hugging Face's own over the same microbatches."""
    cell = run_cell("qwen2-moe-router-aux", 1, 4, "ddp", timeout_s=600, router_aux=True)
    assert cell.outcome == "pass", cell
    assert float(cell.detail) <= TOLERANCE


@pytest.mark.parametrize(
    ("arch", "dp", "cp", "integration"),
    [("llama-1kv-tied", 1, 4, "trainer"), ("qwen2", 2, 2, "fsdp")],
)
def test_the_first_step_of_lora_adapters_equals_the_plain_step(arch: str, dp: int, cp: int, integration: str) -> None:
    """PEFT LoRA (the examples' ``--lora``: adapters of rank 4 on every projection, both factors random, the
    base weights frozen): every adapter's gradient against the plain step of the same PEFT model."""
    cell = run_cell(arch, dp, cp, integration, timeout_s=600, lora=True)
    assert cell.outcome == "pass", cell
    assert float(cell.detail) <= TOLERANCE

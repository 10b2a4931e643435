"""``SkrullTrainer`` refuses, before any step, what would train silently wrong: a model whose attention is
not DACP (shard pieces would meet a stock attention). Activation checkpointing is accepted with context
parallelism (its gradients under torchrun: tests/conformance, tests/worker/hf/test_guards.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import TrainingArguments

from skrull.worker.dataloader import PlannedBatches
from skrull.worker.hf.model import build_model, read_model_config
from skrull.worker.hf.trainer import SkrullTrainer
from skrull.worker.loader_options import LoaderOptions

CONFIG = Path(__file__).resolve().parents[3] / "examples" / "models" / "qwen2-tiny.json"
ROWS = [{"input_ids": list(range(n)), "labels": [*range(1, n), -100]} for n in (5, 9, 30, 60)]


def trainer(
    tmp_path: Path,
    *,
    cp: int,
    attention: str | None = None,
    profile: Any = "h100-80g/qwen2.5-0.5b",
    cp_modes: list[str] | None = None,
    **args: Any,
) -> SkrullTrainer:
    planned = PlannedBatches(
        ROWS,
        [len(r["input_ids"]) for r in ROWS],
        LoaderOptions(
            rank=0, dp=1, cp=cp, global_batch_size=4, profile=profile, bucket_tokens=64, equal_microbatches=True,
            prefetch=0, cp_modes=cp_modes
        ),
    )  # fmt: skip
    model = build_model(read_model_config(str(CONFIG)), seed=0, attn_implementation=attention)
    training = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], max_steps=1, **args)
    return SkrullTrainer(model=model, args=training, planned=planned)


def test_a_model_with_a_stock_attention_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"attn_implementation='sdpa'.*'skrull_dacp'"):
        trainer(tmp_path, cp=1, attention="sdpa")
    assert trainer(tmp_path, cp=1).planned.cp == 1  # the DACP attention is accepted


def test_a_model_whose_heads_are_not_the_profiles_is_refused_where_ulysses_is_allowed(tmp_path: Path) -> None:
    # Qwen2.5-0.5B's profile has 14 attention heads (2 K/V), the tiny Qwen2 4 (2): plans would choose Ulysses
    # groups by 14 heads and price the K/V copies for them; refused at setup, naming profile.heads
    from skrull.solver.errors import RequestError
    from tests.examples.mixed_modes import mixed_profile

    with pytest.raises(RequestError, match=r"profile\.heads.*num_attention_heads = 4, num_key_value_heads = 2"):
        trainer(tmp_path, cp=1, cp_modes=["allgather", "ulysses"])
    assert trainer(tmp_path, cp=1).planned.cp_modes == ("allgather",)  # all-gather alone reads no heads
    # the model's own heads (4, 2): accepted
    accepted = trainer(tmp_path, cp=1, cp_modes=["allgather", "ulysses"], profile=mixed_profile())
    assert accepted.planned.cp_modes == ("allgather", "ulysses")

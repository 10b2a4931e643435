"""``TrainingArguments`` fields that change the loss or the gradient, under ``SkrullTrainer`` in one process
against the plain step: the first step's gradients (taken before the optimizer by a callback) with several
microbatches per step. The refused ones: tests/worker/hf/test_guards.py. The table of every such field:
docs/integrations/hf-trainer.md."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import TrainerCallback, TrainingArguments

from skrull.worker.dataloader import PlannedBatches
from skrull.worker.hf.model import build_model, read_model_config
from skrull.worker.hf.step import plain_step, relative_error
from skrull.worker.hf.trainer import SkrullTrainer
from skrull.worker.loader_options import LoaderOptions

CONFIG = Path(__file__).resolve().parents[3] / "tests" / "conformance" / "models" / "qwen2.json"


class KeepGradients(TrainerCallback):
    """Each parameter's gradient just before the first optimizer step."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.grads: dict[str, torch.Tensor] = {}

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.grads:
            self.grads = {n: p.grad.detach().clone() for n, p in self.model.named_parameters() if p.grad is not None}


def first_step(tmp_path: Path, **args: Any) -> tuple[dict[str, torch.Tensor], list[list[int]], int]:
    rng = random.Random(7)
    rows = [{"input_ids": [rng.randrange(128) for _ in range(rng.choice([9, 30, 60]))]} for _ in range(8)]
    planned = PlannedBatches(
        rows,
        [len(r["input_ids"]) for r in rows],
        LoaderOptions(
            rank=0, dp=1, cp=1, global_batch_size=8, shuffle=False, profile="h100-80g/qwen2.5-0.5b", bucket_tokens=64,
            equal_microbatches=True, prefetch=0
        ),
    )  # fmt: skip
    model = build_model(read_model_config(str(CONFIG)), seed=0)
    training = TrainingArguments(
        output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], max_steps=1, max_grad_norm=0.0,
        optim="sgd", learning_rate=0.0, save_strategy="no", **args,
    )  # fmt: skip
    keep = KeepGradients(model)
    trainer = SkrullTrainer(model=model, args=training, planned=planned, callbacks=[keep], compile="off")
    microbatches = len(next(iter(planned)).microbatches)
    trainer.train()
    planned.close()
    return keep.grads, [r["input_ids"] for r in rows], microbatches


@pytest.mark.parametrize(
    ("args", "tolerance"),
    [
        ({"bf16": True}, 3e-2),  # accelerate's autocast around each forward; the plain step under the same
        ({"torch_compile": True, "torch_compile_backend": "eager"}, 1e-4),  # the Trainer compiles the model
    ],
)
def test_the_first_steps_gradients_equal_the_plain_steps(tmp_path: Path, args: dict, tolerance: float) -> None:
    grads, rows, microbatches = first_step(tmp_path, **args)
    assert microbatches >= 2  # several forwards per step: where a cached cast went wrong under FSDP2
    reference = build_model(read_model_config(str(CONFIG)), seed=0, attn_implementation="eager")
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(args.get("bf16"))):
        plain_step(reference, [torch.tensor(r) for r in rows])
    worst = max(relative_error(grads[n], p.grad) for n, p in reference.named_parameters())
    assert worst <= tolerance, worst

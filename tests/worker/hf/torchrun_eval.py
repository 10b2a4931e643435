"""Run by tests/worker/hf/test_evaluation.py under ``torchrun`` (gloo): ``SkrullTrainer`` with an
``eval_dataset`` and ``eval_strategy='steps'``, as a user's script writes it. Rank 0 prints the eval_loss of
an ``evaluate()`` before training and of the evaluation the Trainer runs after step 1, and saves the final
weights; the test compares both with the plain single-process ``Trainer.evaluate``.

    torchrun --nproc-per-node N torchrun_eval.py DP CP BUCKET_TOKENS EVAL_BATCH_SIZE OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from transformers import TrainingArguments

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from skrull.worker.dataloader import PlannedBatches  # noqa: E402
from skrull.worker.hf.model import build_model, read_model_config  # noqa: E402
from skrull.worker.hf.trainer import SkrullTrainer  # noqa: E402
from skrull.worker.loader_options import LoaderOptions  # noqa: E402
from tests.worker.hf.eval_rows import CONFIG, eval_rows, train_rows  # noqa: E402
from tests.worker.hf.process_group import run_and_destroy_group  # noqa: E402


def main() -> int:
    dp, cp, bucket, eval_batch = (int(x) for x in sys.argv[1:5])
    out = Path(sys.argv[5])
    args = TrainingArguments(
        output_dir=str(out / "run"), use_cpu=True, ddp_backend="gloo", report_to=[], max_steps=1,
        per_device_train_batch_size=1, per_device_eval_batch_size=eval_batch, eval_strategy="steps",
        eval_steps=1, logging_steps=1, optim="sgd", learning_rate=0.05, lr_scheduler_type="constant",
        save_strategy="no", remove_unused_columns=False,
    )  # fmt: skip
    device = args.device
    mesh = init_device_mesh(device.type, (dp, cp), mesh_dim_names=("dp", "cp"))
    rows = train_rows()
    planned = PlannedBatches(
        rows,
        [len(r["input_ids"]) for r in rows],
        LoaderOptions(
            global_batch_size=4, profile="h100-80g/qwen2.5-0.5b", bucket_tokens=bucket, solver="skrull",
            equal_microbatches=True, label_convention="hf", num_iterations=1
        ),
        mesh=mesh,
    )  # fmt: skip
    model = build_model(read_model_config(str(CONFIG)), seed=0, device=device)
    trainer = SkrullTrainer(model=model, args=args, planned=planned, eval_dataset=eval_rows())
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    during = [log["eval_loss"] for log in trainer.state.log_history if "eval_loss" in log]
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), out / "final.pt")
        (out / "result.json").write_text(json.dumps({"before": before, "during": during}))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_and_destroy_group(main))

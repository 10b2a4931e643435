"""Evaluation under plans reports the eval_loss of the plain single-process ``Trainer.evaluate`` on the same
eval set: in one process, and under ``torchrun`` at DP2 x CP2 with rows sharded over their CP group, both
from ``evaluate()`` and from the Trainer's own ``eval_strategy='steps'`` evaluation during training."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import Trainer, TrainingArguments

from skrull.worker.dataloader import PlannedBatches
from skrull.worker.hf.evaluation import plain_eval_loss
from skrull.worker.hf.model import build_model, read_model_config
from skrull.worker.hf.trainer import SkrullTrainer
from skrull.worker.loader_options import LoaderOptions
from tests.launch import run_torchrun
from tests.worker.hf.eval_rows import CONFIG, eval_rows, train_rows

#: One process's loader settings over ``train_rows``, in Hugging Face's label convention.
OPTIONS = LoaderOptions(
    rank=0, dp=1, cp=1, global_batch_size=4, solver="skrull", profile="h100-80g/qwen2.5-0.5b", bucket_tokens=128,
    equal_microbatches=True, prefetch=0, label_convention="hf",
)  # fmt: skip

HERE = Path(__file__).resolve().parent
TOLERANCE = 1e-4


def pad(rows: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    """A stock padding collator: right-padded ids, labels -100 on padding, the attention mask."""
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for k, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[k, :n], labels[k, :n], mask[k, :n] = torch.tensor(r["input_ids"]), torch.tensor(r["labels"]), 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def plain_eval(tmp_path: Path, *, batch_size: int, state: dict[str, Any] | None = None) -> float:
    """The plain single-process Trainer.evaluate: eager attention, padded batches."""
    model = build_model(read_model_config(str(CONFIG)), seed=0, attn_implementation="eager")
    if state is not None:
        model.load_state_dict(state)
    args = TrainingArguments(
        output_dir=str(tmp_path / "plain"), use_cpu=True, report_to=[], per_device_eval_batch_size=batch_size,
        remove_unused_columns=False,
    )  # fmt: skip
    trainer = Trainer(model=model, args=args, eval_dataset=eval_rows(), data_collator=pad)
    return float(trainer.evaluate()["eval_loss"])


def test_the_batch_weighting_is_the_trainers() -> None:
    # batches of 2 rows: (1 + 3) / 2 = 2 and 5 / 1; the last batch weighs its one row
    assert plain_eval_loss([1.0, 3.0, 5.0], [1, 1, 1], batch_size=2) == pytest.approx((2 * 2 + 1 * 5) / 3)
    assert plain_eval_loss([1.0, 3.0, 5.0], [1, 2, 1], batch_size=8) == pytest.approx(9 / 4)  # one batch: token mean
    assert plain_eval_loss([1.0, 0.0], [1, 0], batch_size=1) == pytest.approx(1.0)  # no target: left out
    with pytest.raises(ValueError, match="per_device_eval_batch_size=0"):
        plain_eval_loss([1.0], [1], batch_size=0)


@given(
    rows=st.lists(st.tuples(st.floats(0, 50), st.integers(1, 40)), min_size=1, max_size=30),
    batch_size=st.integers(1, 40),
)
def test_one_batch_is_the_token_mean_and_the_batches_average_their_means(
    rows: list[tuple[float, int]], batch_size: int
) -> None:
    sums, counts = [s for s, _ in rows], [c for _, c in rows]
    token_mean = sum(sums) / sum(counts)
    assert plain_eval_loss(sums, counts, batch_size=len(rows)) == pytest.approx(token_mean)
    means = [sum(sums[k : k + batch_size]) / sum(counts[k : k + batch_size]) for k in range(0, len(rows), batch_size)]
    got = plain_eval_loss(sums, counts, batch_size=batch_size)
    assert min(means) - 1e-9 <= got <= max(means) + 1e-9  # a weighted mean of the batch means


@pytest.mark.parametrize("batch_size", [3, 16])
def test_one_process_reports_the_plain_trainers_eval_loss(tmp_path: Path, batch_size: int) -> None:
    rows = train_rows()
    planned = PlannedBatches(
        rows,
        [len(r["input_ids"]) for r in rows],
        OPTIONS,
    )  # fmt: skip
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], max_steps=1,
        per_device_eval_batch_size=batch_size, eval_strategy="steps", eval_steps=1,
    )  # fmt: skip
    model = build_model(read_model_config(str(CONFIG)), seed=0)
    trainer = SkrullTrainer(model=model, args=args, planned=planned, eval_dataset=eval_rows())
    got = trainer.evaluate()
    want = plain_eval(tmp_path, batch_size=batch_size)
    assert abs(got["eval_loss"] - want) <= TOLERANCE * abs(want), (got, want)
    assert model.training  # evaluation leaves the model as it found it


def test_a_row_no_layout_holds_is_refused_before_training(tmp_path: Path) -> None:
    rows = train_rows()
    planned = PlannedBatches(
        rows,
        [len(r["input_ids"]) for r in rows],
        dataclasses.replace(OPTIONS, bucket_tokens=64),
    )  # fmt: skip
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], max_steps=1, eval_strategy="steps"
    )
    model = build_model(read_model_config(str(CONFIG)), seed=0)
    with pytest.raises(ValueError, match=r"dataset\[2\].*90.*no layout holds it"):
        SkrullTrainer(model=model, args=args, planned=planned, eval_dataset=eval_rows())


def test_compute_metrics_is_refused_naming_it(tmp_path: Path) -> None:
    rows = train_rows()
    planned = PlannedBatches(
        rows,
        [len(r["input_ids"]) for r in rows],
        dataclasses.replace(OPTIONS, label_convention="next_token"),
    )  # fmt: skip
    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], max_steps=1)
    model = build_model(read_model_config(str(CONFIG)), seed=0)
    with pytest.raises(ValueError, match="compute_metrics is given"):
        SkrullTrainer(model=model, args=args, planned=planned, eval_dataset=eval_rows(), compute_metrics=len)


def test_dp2_cp2_under_torchrun_reports_the_plain_trainers_eval_loss(tmp_path: Path) -> None:
    batch_size = 4
    args = ["2", "2", "48", str(batch_size), str(tmp_path)]
    out = run_torchrun(HERE / "torchrun_eval.py", args, nproc=4, cwd=tmp_path, timeout_s=600)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    before = plain_eval(tmp_path, batch_size=batch_size)
    after = plain_eval(tmp_path, batch_size=batch_size, state=torch.load(tmp_path / "final.pt"))
    assert abs(result["before"] - before) <= TOLERANCE * abs(before), (result, before)
    assert len(result["during"]) == 1  # eval_strategy='steps', eval_steps=1, one step
    assert abs(result["during"][0] - after) <= TOLERANCE * abs(after), (result, after)
    assert after != before  # the step changed the model, and the evaluation saw it


def test_named_eval_sets_each_report_their_loss(tmp_path: Path) -> None:
    rows = train_rows()
    planned = PlannedBatches(
        rows,
        [len(r["input_ids"]) for r in rows],
        OPTIONS,
    )  # fmt: skip
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], max_steps=1, per_device_eval_batch_size=64
    )
    sets = {"short": eval_rows()[:5], "long": eval_rows()[5:]}
    model = build_model(read_model_config(str(CONFIG)), seed=0)
    metrics = SkrullTrainer(model=model, args=args, planned=planned, eval_dataset=sets).evaluate()
    assert metrics["eval_short_loss"] != metrics["eval_long_loss"]
    whole = SkrullTrainer(model=model, args=args, planned=planned, eval_dataset=eval_rows()).evaluate()["eval_loss"]
    assert min(metrics["eval_short_loss"], metrics["eval_long_loss"]) < whole
    assert whole < max(metrics["eval_short_loss"], metrics["eval_long_loss"])

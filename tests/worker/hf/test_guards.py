"""What used to train silently wrong or hang is refused before the first step, naming the setting and the
fix: under real ``torchrun`` (2 gloo processes), and in one process where one suffices."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from transformers import TrainingArguments

from skrull.worker.dataloader import PlannedBatches
from skrull.worker.hf.model import build_model, read_model_config
from skrull.worker.hf.trainer import SkrullTrainer
from skrull.worker.loader_options import LoaderOptions
from tests.launch import run_torchrun

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
CONFIG = ROOT / "examples" / "models" / "llama-tiny.json"
ROWS = [{"input_ids": list(range(n)), "labels": [*range(1, n), -100]} for n in (5, 9, 30, 60)]


def torchrun(case: str, tmp_path: Path) -> list[str]:
    out = run_torchrun(HERE / "torchrun_guards.py", [case], nproc=2, cwd=tmp_path, timeout_s=300)
    assert out.returncode == 0, out.stderr[-3000:]
    by_rank = [(tmp_path / f"report-{rank}.txt").read_text(encoding="utf-8").splitlines() for rank in (0, 1)]
    assert by_rank[0] == by_rank[1], by_rank  # every rank stops with the same line, in the same case
    return by_rank[0]


def test_a_trainer_without_use_cpu_on_a_cpu_under_torchrun_is_refused(tmp_path: Path) -> None:
    lines = torchrun("no-use-cpu", tmp_path)
    assert len(lines) == 1
    assert "the Trainer runs 1 process(es)" in lines[0] and "torch.distributed 2" in lines[0]
    assert "use_cpu=True, ddp_backend='gloo'" in lines[0]


def test_gloo_without_use_cpu_made_before_the_mesh_is_refused_and_checkpointing_with_cp_trains(
    tmp_path: Path,
) -> None:
    """TrainingArguments(ddp_backend='gloo') made first initializes the process group: accelerate then counts
    2 processes but syncs nothing (found: relative error 3.2, silently), so it is refused. Checkpointing
    turned on on the model with CP > 1 once hung the own loop: a recomputation inside the DACP attention's
    backward ran the CP all-gather on some ranks of a group only. Now each layer is recomputed once, at
    the same point on every rank: all-gathers (forward + recomputation) are exactly twice the
    reduce-scatters (backward)."""
    trainer, loop = torchrun("no-use-cpu-args-first", tmp_path)
    assert "accelerate state is NO with 2 processes" in trainer and "it would never sync gradients" in trainer
    assert "use_cpu=True, ddp_backend='gloo'" in trainer
    match = re.fullmatch(r"trained: (\d+) all-gathers, (\d+) reduce-scatters", loop)
    assert match, loop
    gathers, scatters = int(match.group(1)), int(match.group(2))
    assert scatters > 0 and gathers == 2 * scatters, loop


def test_unequal_counts_and_stock_fsdp_are_refused_and_the_wrapped_loop_trains(tmp_path: Path) -> None:
    lines = torchrun("loop", tmp_path)
    trainer, checkpointing, stock, unequal_plans, unequal, wrapped = lines
    assert "equal_microbatches=False with 2 processes" in trainer
    assert checkpointing == "trained"  # the Trainer with checkpointing on the model, CP 2
    assert "sharded with FSDP2 fully_shard not by skrull.worker.grad_sync.wrap" in stock
    # the loader's setting, at the first step (its counts may still be equal there), not hours later
    assert "equal_microbatches=False: the loader plans DP ranks with different microbatch counts" in unequal_plans
    assert "FSDP2 cannot run" in unequal_plans and "equal_microbatches=True" in unequal_plans
    # plans from elsewhere: the counts themselves, checked on every rank before any forward
    assert "equal_microbatches: ranks run 0 to 1 microbatches" in unequal
    assert wrapped == "trained"


def make(
    tmp_path: Path, *, dp: int = 1, cp: int = 1, config: dict | None = None, eval_dataset: object = None, **args: object
) -> SkrullTrainer:
    planned = PlannedBatches(
        ROWS,
        [len(r["input_ids"]) for r in ROWS],
        LoaderOptions(
            rank=0, dp=dp, cp=cp, global_batch_size=4, profile="h100-80g/qwen2.5-0.5b", bucket_tokens=64,
            equal_microbatches=True, prefetch=0
        ),
    )  # fmt: skip
    doc = {**read_model_config(str(CONFIG)), **(config or {})}
    model = build_model(doc, seed=0) if config is None else build_model(read_model_config(str(CONFIG)), seed=0)
    if config:
        for key, value in config.items():
            setattr(model.config, key, value)  # a from_pretrained model's config, as loaded
    training = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], max_steps=1, **args)
    return SkrullTrainer(model=model, args=training, planned=planned, eval_dataset=eval_dataset)


def test_a_mesh_larger_than_the_trainers_world_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"the Trainer runs 1 process\(es\).*dp x cp = 2 x 1 = 2: they must be equal"):
        make(tmp_path, dp=2)


@pytest.mark.parametrize(
    ("config", "field"),
    [({"attention_dropout": 0.1}, "attention_dropout=0.1"), ({"attention_chunk_size": 8}, "attention_chunk_size=8")],
)
def test_attention_features_dacp_does_not_compute_are_refused_naming_the_field(
    tmp_path: Path, config: dict, field: str
) -> None:
    with pytest.raises(ValueError, match=f"model config {field}: an attention feature"):
        make(tmp_path, config=config)


def test_a_per_device_batch_size_the_plan_would_ignore_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"per_device_train_batch_size=3: the planned loader's global_batch_size=4"):
        make(tmp_path, per_device_train_batch_size=3)
    assert make(tmp_path, per_device_train_batch_size=4).planned.global_batch_size == 4  # what the loader does


def test_evaluation_builds_its_loader_before_training(tmp_path: Path) -> None:
    # it crashed at the first evaluation; it now runs under plans (tests/worker/hf/test_evaluation.py)
    trainer = make(tmp_path, eval_strategy="steps", eval_steps=1, eval_dataset=ROWS)
    (loader,) = [loader for _, loader in trainer._eval_loaders.values()]
    assert [i for b in loader.batches for i in b] == list(range(len(ROWS)))  # every row once, in order


def test_epochs_reshuffle_count_real_tokens_and_size_the_schedule(tmp_path: Path) -> None:
    rows = [{"input_ids": [(i + t) % 128 for t in range(3 + 5 * i)]} for i in range(8)]
    planned = PlannedBatches(
        rows,
        [len(r["input_ids"]) for r in rows],
        LoaderOptions(
            rank=0, dp=1, cp=1, global_batch_size=4, solver="skrull", profile="h100-80g/qwen2.5-0.5b",
            bucket_tokens=64, equal_microbatches=True, prefetch=0
        ),
    )  # fmt: skip
    seen: list[tuple[int, ...]] = []
    original = planned._ready

    def record(*a: object, **kw: object) -> object:
        ready = original(*a, **kw)  # type: ignore[arg-type]
        seen.append(ready.sample_indices)
        return ready

    planned._ready = record  # type: ignore[method-assign]
    training = TrainingArguments(
        output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], num_train_epochs=2, logging_steps=1,
        include_num_input_tokens_seen=True, optim="sgd", learning_rate=0.01, lr_scheduler_type="linear",
    )  # fmt: skip
    trainer = SkrullTrainer(model=build_model(read_model_config(str(CONFIG)), seed=0), args=training, planned=planned)
    trainer.train()
    assert trainer.state.global_step == 4 and trainer.state.max_steps == 4  # 2 epochs x 2 iterations
    assert sorted(i for b in seen[:2] for i in b) == sorted(i for b in seen[2:] for i in b) == list(range(8))
    assert seen[:2] != seen[2:]  # epoch 1 is reshuffled
    assert trainer.state.num_input_tokens_seen == 2 * sum(len(r["input_ids"]) for r in rows)  # real tokens
    epochs = [log["epoch"] for log in trainer.state.log_history if "loss" in log]
    assert epochs == [0.5, 1.0, 1.5, 2.0]
    assert trainer.lr_scheduler.get_last_lr()[0] == 0.0  # the linear schedule ran its whole length


MODELS = ROOT / "tests" / "conformance" / "models"


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"label_smoothing_factor": 0.1}, "label_smoothing_factor=0.1"),
        ({"average_tokens_across_devices": False}, "average_tokens_across_devices=False"),
        ({"neftune_noise_alpha": 5.0}, "neftune_noise_alpha=5.0"),
        ({"fp16": True}, "fp16=True"),
        ({"auto_find_batch_size": True}, "auto_find_batch_size=True"),
        ({"dataloader_drop_last": True}, "dataloader_drop_last=True"),
        ({"train_sampling_strategy": "group_by_length"}, "train_sampling_strategy='group_by_length'"),
    ],
)
def test_training_arguments_that_change_the_loss_are_refused_naming_the_field(
    tmp_path: Path, args: dict, field: str
) -> None:
    """Found: label_smoothing_factor=0.1 trained unsmoothed under SkrullTrainer (gradient error 0.12 against the
    plain Trainer), silently; every field of the table in docs/integrations/hf-trainer.md marked refused."""
    with pytest.raises(ValueError, match=re.escape(f"TrainingArguments({field}): not trained exactly under plans")):
        make(tmp_path, **args)


@pytest.mark.parametrize("name", ["qwen2-moe", "mixtral", "qwen3-moe"])
def test_the_routers_auxiliary_loss_is_refused_on_every_path(tmp_path: Path, name: str) -> None:
    """Found: Qwen2-MoE with output_router_logits=True, loss 9.68 against the plain step's 6.51 and the router
    gate's gradient 71x off, through from_pretrained(..., attn_implementation=register()) which nothing checked.
    build_model (and skrull finetune, which reads the config with it) and the Trainer refuse it alike."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from skrull.worker.hf.attention import register
    from skrull.worker.hf.step import refuse_untrained_model

    doc = {**read_model_config(str(MODELS / f"{name}.json")), "output_router_logits": True}
    with pytest.raises(ValueError, match=r"output_router_logits.*True.*set output_router_logits=False"):
        build_model(doc, seed=0)
    fields = {k: v for k, v in doc.items() if k != "model_type"}
    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(doc["model_type"], **fields), attn_implementation=register()
    )
    with pytest.raises(ValueError, match="model config output_router_logits=True: the router's auxiliary"):
        refuse_untrained_model(model)  # what scheduled_step runs before its first collective
    model.config.output_router_logits = False
    refuse_untrained_model(model)  # the expert layers themselves train exactly (conformance cells)


def test_one_list_of_architectures_for_build_model_and_the_register_path() -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    from skrull.worker.hf.attention import SUPPORTED_MODEL_TYPES, register
    from skrull.worker.hf.model import check_model_config
    from skrull.worker.hf.step import refuse_untrained_model

    assert "gemma3_text" in SUPPORTED_MODEL_TYPES  # trains exactly (a conformance cell), once refused by a list
    check_model_config(read_model_config(str(MODELS / "gemma3-window.json")))
    gpt2 = AutoModelForCausalLM.from_config(
        AutoConfig.for_model("gpt2", n_layer=1, n_embd=16, n_head=2, vocab_size=64), attn_implementation=register()
    )
    with pytest.raises(ValueError, match="model config model_type='gpt2': not one of the architectures"):
        refuse_untrained_model(gpt2)
    with pytest.raises(ValueError, match="model_type"):
        check_model_config({**read_model_config(str(CONFIG)), "model_type": "gpt2"})


def test_a_model_with_dropout_training_in_eval_mode_is_warned_once() -> None:
    """from_pretrained returns a model in eval mode: a loop without model.train() trained with dropout off."""
    import warnings

    from skrull.worker.hf.step import warn_eval_mode_dropout

    model = build_model(read_model_config(str(MODELS / "phi3.json")), seed=0)
    model.config.resid_pdrop = 0.1
    model.train()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_eval_mode_dropout(model)  # training mode: silent
    model.eval()
    with pytest.warns(UserWarning, match=r"trains in eval mode with dropout 0.1.*call model.train\(\)"):
        warn_eval_mode_dropout(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_eval_mode_dropout(model)  # once per model

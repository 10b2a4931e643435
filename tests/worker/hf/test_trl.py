"""``SkrullSFTTrainer`` (worker/hf/trl.py) in one process: chats go through the tokenizer's chat template
as TRL prepares them, only the assistant turns are trained, and what the plan replaces is refused."""

from __future__ import annotations

import functools
from typing import Any

import pytest

pytest.importorskip("trl")

from datasets import Dataset
from trl import SFTConfig

from examples import trl_sft
from skrull.worker.dataloader import PlannedBatches
from skrull.worker.hf.model import build_model, read_model_config
from skrull.worker.hf.trl import SkrullSFTTrainer
from skrull.worker.loader_options import LoaderOptions
from skrull.worker.loss import IGNORE_INDEX
from tests.docs.test_links import ROOT

CHATS = [
    [
        {"role": "system", "content": "each gpu trains"},
        {"role": "user", "content": "why shard a long sequence"},
        {"role": "assistant", "content": "it is too long for a bucket"},
        {"role": "user", "content": "and short ones"},
        {"role": "assistant", "content": "pack them"},
    ],
    [{"role": "user", "content": "what does the planner do"}, {"role": "assistant", "content": "balances ranks"}],
    [{"role": "user", "content": "how"}, {"role": "assistant", "content": "every rank gets the same plan"}],
    [{"role": "user", "content": "one token"}, {"role": "assistant", "content": "step"}],
]


@pytest.fixture(autouse=True)
def _no_telemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_TELEMETRY", True)


def make_trainer(tmp_path: Any, *, cp: int = 1, **config: Any) -> SkrullSFTTrainer:
    tokenizer = trl_sft.build_tokenizer(CHATS)
    model = build_model(read_model_config(ROOT / "examples" / "models" / "qwen2-tiny.json"), seed=0)
    fields: dict[str, Any] = {
        "output_dir": str(tmp_path / "out"), "max_steps": 1, "use_cpu": True, "bf16": False, "report_to": [],
        "assistant_only_loss": True, "activation_checkpointing": False, **config,
    }  # fmt: skip
    options = LoaderOptions(rank=0, dp=1, cp=cp, global_batch_size=2, profile="h100-80g/qwen2.5-0.5b",
                            equal_microbatches=True)  # fmt: skip
    planned = functools.partial(PlannedBatches, options=options)
    return SkrullSFTTrainer(
        model=model,
        args=SFTConfig(**fields),
        train_dataset=Dataset.from_list([{"messages": c} for c in CHATS]),
        processing_class=tokenizer,
        planned=planned,
    )


def test_chats_go_through_the_chat_template_and_only_assistant_tokens_are_trained(tmp_path: Any) -> None:
    trainer = make_trainer(tmp_path)
    tokenizer = trainer.processing_class
    rows = trainer.planned.dataset
    assert len(rows) == len(CHATS)
    for index, chat in enumerate(CHATS):
        rendered = tokenizer.apply_chat_template(chat, tokenize=True, return_dict=True)["input_ids"]
        row = rows[index]
        assert row["input_ids"] == list(rendered)  # the tokenizer's own template, nothing added
        assert trainer.planned.lengths[index] == len(rendered)
        # the loader's labels are next-token targets: position j is trained on token j + 1
        trained = [row["input_ids"][j + 1] for j, t in enumerate(row["labels"]) if t != IGNORE_INDEX]
        assert [t for t in row["labels"] if t != IGNORE_INDEX] == trained
        expected = [w for m in chat if m["role"] == "assistant" for w in [*m["content"].split(), "<|im_end|>"]]
        assert tokenizer.convert_ids_to_tokens(trained) == expected  # the assistant turns and their end, no more
        assert row["labels"][-1] == IGNORE_INDEX


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"packing": True}, "packing=True"),
        ({"padding_free": True}, "padding_free=True"),
        ({"label_smoothing_factor": 0.1}, "label_smoothing_factor=0.1"),
        ({"average_tokens_across_devices": False}, "average_tokens_across_devices=False"),
    ],
)
def test_what_the_plan_replaces_is_refused(tmp_path: Any, config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_trainer(tmp_path, **config)


@pytest.mark.parametrize("batch_size", [3, 64])
def test_evaluation_reports_the_plain_sft_trainers_eval_loss(tmp_path: Any, batch_size: int) -> None:
    from trl import SFTTrainer

    chats = [row["messages"] for row in trl_sft.demo_chats(10, seed=5)]
    evaluation = Dataset.from_list([{"messages": c} for c in chats])
    tokenizer = trl_sft.build_tokenizer([*CHATS, *chats])
    config = read_model_config(ROOT / "examples" / "models" / "qwen2-tiny.json")
    fields: dict[str, Any] = {
        "max_steps": 1, "use_cpu": True, "bf16": False, "report_to": [], "assistant_only_loss": True,
        "activation_checkpointing": False, "per_device_eval_batch_size": batch_size,
    }  # fmt: skip
    options = LoaderOptions(rank=0, dp=1, cp=1, global_batch_size=2, profile="h100-80g/qwen2.5-0.5b",
                            equal_microbatches=True, bucket_tokens=256)  # fmt: skip
    planned = functools.partial(PlannedBatches, options=options)
    trainer = SkrullSFTTrainer(
        model=build_model(config, seed=0),
        args=SFTConfig(output_dir=str(tmp_path / "a"), eval_strategy="steps", eval_steps=1, **fields),
        train_dataset=Dataset.from_list([{"messages": c} for c in CHATS]),
        eval_dataset=evaluation,
        processing_class=tokenizer,
        planned=planned,
    )
    got = trainer.evaluate()["eval_loss"]
    plain = SFTTrainer(
        model=build_model(config, seed=0, attn_implementation="eager"),
        args=SFTConfig(output_dir=str(tmp_path / "b"), **fields),
        train_dataset=Dataset.from_list([{"messages": c} for c in CHATS]),
        eval_dataset=evaluation,
        processing_class=tokenizer,
    )
    want = plain.evaluate()["eval_loss"]
    assert 0 < want < float("inf") and abs(got - want) <= 1e-4 * abs(want), (got, want)

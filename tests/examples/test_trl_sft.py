"""``examples/trl_sft.py``: a stock TRL SFT script on a chat dataset under plans, run as users run it
(``torchrun --standalone --nproc-per-node 4``, gloo on CPU), whose first step equals the plain
single-process ``SFTTrainer`` step on the same global batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.docs.test_links import ROOT
from tests.launch import run_torchrun

pytest.importorskip("trl")

from examples import trl_sft
from skrull.corpus.order import global_batches

BUCKET_TOKENS = 64


def test_the_sft_script_under_torchrun_passes_its_check(tmp_path: Path) -> None:
    data = tmp_path / "chats.jsonl"
    rows = trl_sft.demo_chats(32, seed=3)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # the first global batch holds chats longer than one GPU's bucket: the plan must shard them over CP
    tokenizer = trl_sft.build_tokenizer([r["messages"] for r in rows])
    first = global_batches(len(rows), global_batch_size=8, seed=0)[0]
    lengths = [len(tokenizer.apply_chat_template(rows[i]["messages"], tokenize=True, return_dict=True)["input_ids"])
               for i in first]  # fmt: skip
    assert max(lengths) > BUCKET_TOKENS
    args = [
        "--model-config", str(ROOT / "examples" / "models" / "qwen2-tiny.json"), "--data", str(data),
        "--dp", "2", "--cp", "2", "--global-batch-size", "8", "--bucket-tokens", str(BUCKET_TOKENS),
        "--max-steps", "2", "--check", "--output-dir", str(tmp_path / "out"),
    ]  # fmt: skip
    # nothing leaves the machine: no telemetry, no hub look-ups; the datasets cache under tmp_path
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HOME": str(tmp_path / "hf")}
    out = run_torchrun(ROOT / "examples" / "trl_sft.py", args, nproc=4, cwd=tmp_path, timeout_s=600, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    losses = [line for line in out.stdout.splitlines() if line.startswith("losses: ")]
    assert len(losses) == 1 and len(losses[0].split()) == 3  # two steps, their world losses
    assert "27 gradients and the loss" in out.stdout
    largest = [line for line in out.stdout.splitlines() if line.startswith("largest relative error: ")]
    assert len(largest) == 1 and float(largest[0].split()[3]) <= 1e-4
    assert out.stdout.rstrip().endswith("check passed")
    # no rank repeats a warning whose cause is known: the random model takes the tokenizer's EOS up front,
    # and DDP is not asked to search for unused parameters (worker/hf/trainer.py)
    assert "PAD/BOS/EOS" not in out.stderr


def test_the_sft_script_on_plans_mixing_allgather_and_ulysses_passes_its_check(tmp_path: Path) -> None:
    # DP1 x CP4, buckets of 32 tokens: the first step's plan shards some chats with the all-gather and
    # some with Ulysses (the mixed profile, 4 heads, 2 K/V)
    from tests.examples.mixed_modes import run_mixed

    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in trl_sft.demo_chats(32, seed=3)))
    offline = {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HOME": str(tmp_path / "hf")}
    run_mixed(
        "trl_sft.py",
        ["--data", str(data), "--global-batch-size", "8", "--bucket-tokens", "32", "--max-steps", "2",
         "--output-dir", str(tmp_path / "out")],
        tmp_path,
        env=offline,
    )  # fmt: skip

"""``examples/hf_trainer.py``: a stock Hugging Face Trainer script under plans, run as users run it
(``torchrun --standalone --nproc-per-node 4``, gloo on CPU), whose first step equals the plain step."""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

import pytest

from tests.cli.piped import run_piped
from tests.docs.test_links import ROOT
from tests.examples.mixed_modes import run_mixed, write_mixed_rows
from tests.launch import run_torchrun


def write_rows(path: Path, *, n: int, seed: int, vocab: int = 128) -> Path:
    rng = random.Random(seed)
    lengths = [3, 5, 9, 17, 30, 60, 100, 120]
    rows = [{"input_ids": [rng.randrange(vocab) for _ in range(rng.choice(lengths))]} for _ in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_trainer_script_under_torchrun_passes_its_check(tmp_path: Path) -> None:
    data = write_rows(tmp_path / "train.jsonl", n=64, seed=3)
    args = [
        "--model-config", str(ROOT / "examples" / "models" / "qwen2-tiny.json"), "--data", str(data),
        "--dp", "2", "--cp", "2", "--global-batch-size", "16", "--bucket-tokens", "64", "--max-steps", "2",
        "--check", "--output-dir", str(tmp_path / "out"),
    ]  # fmt: skip
    out = run_torchrun(ROOT / "examples" / "hf_trainer.py", args, nproc=4, cwd=tmp_path, timeout_s=600)
    assert out.returncode == 0, out.stderr[-3000:]
    losses = [line for line in out.stdout.splitlines() if line.startswith("losses: ")]
    assert len(losses) == 1 and len(losses[0].split()) == 3  # two steps, their world losses
    largest = [line for line in out.stdout.splitlines() if line.startswith("largest relative error: ")]
    assert len(largest) == 1 and float(largest[0].split()[3]) <= 1e-4
    assert out.stdout.rstrip().endswith("check passed")


def test_the_trainer_script_with_compiled_layers_passes_its_check(tmp_path: Path) -> None:
    """The fast step under the Trainer (``--compile on``: inductor on the CPU), DP1 x CP2 with shard pieces."""
    data = write_rows(tmp_path / "train.jsonl", n=32, seed=4)
    args = [
        "--model-config", str(ROOT / "examples" / "models" / "qwen2-tiny.json"), "--data", str(data),
        "--dp", "1", "--cp", "2", "--global-batch-size", "8", "--bucket-tokens", "64", "--max-steps", "1",
        "--compile", "on", "--check", "--output-dir", str(tmp_path / "out"),
    ]  # fmt: skip
    out = run_torchrun(ROOT / "examples" / "hf_trainer.py", args, nproc=2, cwd=tmp_path, timeout_s=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "attention kernel: reference (best usable); decoder layers compiled" in out.stderr
    largest = [line for line in out.stdout.splitlines() if line.startswith("largest relative error: ")]
    assert len(largest) == 1 and float(largest[0].split()[3]) <= 1e-4
    assert out.stdout.rstrip().endswith("check passed")


def test_the_trainer_script_with_one_graph_layers_passes_its_check(tmp_path: Path) -> None:
    """``--compile fullgraph``: each layer one graph, the attention the registered operator with the
    collectives inside, under the Trainer, DP1 x CP2 with shard pieces, two steps."""
    data = write_rows(tmp_path / "train.jsonl", n=32, seed=6)
    args = [
        "--model-config", str(ROOT / "examples" / "models" / "qwen2-tiny.json"), "--data", str(data),
        "--dp", "1", "--cp", "2", "--global-batch-size", "8", "--bucket-tokens", "64", "--max-steps", "2",
        "--compile", "fullgraph", "--check", "--output-dir", str(tmp_path / "out"),
    ]  # fmt: skip
    out = run_torchrun(ROOT / "examples" / "hf_trainer.py", args, nproc=2, cwd=tmp_path, timeout_s=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "attention kernel: reference (best usable); decoder layers compiled, one graph per layer" in out.stderr
    largest = [line for line in out.stdout.splitlines() if line.startswith("largest relative error: ")]
    assert len(largest) == 1 and float(largest[0].split()[3]) <= 1e-4
    assert out.stdout.rstrip().endswith("check passed")


@pytest.mark.torchrun  # examples/hf_trainer.py --resume-check starts torchrun itself, three times
def test_a_run_resumed_from_a_trainer_checkpoint_in_new_processes_is_the_straight_run(tmp_path: Path) -> None:
    data = write_rows(tmp_path / "train.jsonl", n=64, seed=5)
    cmd = [
        sys.executable, str(ROOT / "examples" / "hf_trainer.py"), "--resume-check",
        "--model-config", str(ROOT / "examples" / "models" / "qwen2-tiny.json"), "--data", str(data),
        "--dp", "2", "--cp", "2", "--global-batch-size", "16", "--bucket-tokens", "64", "--max-steps", "4",
    ]  # fmt: skip
    # output a pipe, as under `| tee` or CI: each run, each step and the check say themselves as they start
    run = run_piped(cmd, timeout_s=900, cwd=tmp_path)
    assert run.returncode == 0, "\n".join(run.lines[-60:])
    assert run.running_after_first_line, run.lines
    lines = run.lines
    said = [x for x in lines if x.startswith("hf_trainer: ")]
    assert lines[0] == said[0] == "hf_trainer: run 1/3: 4 steps straight (torchrun, 4 processes)"
    runs = [x for x in said if x.startswith("hf_trainer: run ")]
    assert runs[1:] == [
        "hf_trainer: run 2/3: the first 2 steps, a checkpoint after step 2 (torchrun, 4 processes)",
        "hf_trainer: run 3/3: steps 3-4 resumed from checkpoint-2 in new processes (torchrun, 4 processes)",
    ]
    steps = [x for x in said if x.startswith("hf_trainer:   step ")]
    assert [re.sub(r"loss \d+\.\d+$", "loss <F>", x) for x in steps] == [
        f"hf_trainer:   step {k}/{n}: loss <F>"
        for k, n in [(1, 4), (2, 4), (3, 4), (4, 4), (1, 2), (2, 2), (3, 4), (4, 4)]
    ]
    assert (
        said.index(steps[3]) < said.index(runs[1]) < said.index(steps[4]) < said.index(steps[5]) < said.index(runs[2])
    )
    assert said[-1].startswith("hf_trainer: checking: ")
    straight = next(x for x in lines if x.startswith("losses straight: ")).split()[2:]
    resumed = next(x for x in lines if x.startswith("losses resumed: ")).split()[2:6]
    assert straight == resumed and len(straight) == 4
    assert "largest loss difference 0.000e+00, largest final weight difference 0.000e+00" in lines  # CPU: bitwise
    assert lines[-1] == "check passed"


def test_a_saved_model_with_prompt_masked_labels_passes_the_check(tmp_path: Path) -> None:
    # --model takes a directory from save_pretrained, as a user's own checkpoint; rows carry labels that
    # mask a prompt (-100), which both the planned and the plain step must skip
    from skrull.worker.hf.model import build_model, read_model_config

    model = build_model(read_model_config(str(ROOT / "examples" / "models" / "llama-tiny.json")), seed=11)
    model.save_pretrained(tmp_path / "model")
    rng = random.Random(7)
    rows = []
    for _ in range(24):
        ids = [rng.randrange(128) for _ in range(rng.choice([4, 9, 20, 45, 90]))]
        prompt = len(ids) // 3
        rows.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = [
        "--model", str(tmp_path / "model"), "--data", str(data), "--dp", "1", "--cp", "2",
        "--global-batch-size", "12", "--bucket-tokens", "64", "--max-steps", "1", "--check",
        "--output-dir", str(tmp_path / "out"),
    ]  # fmt: skip
    out = run_torchrun(ROOT / "examples" / "hf_trainer.py", args, nproc=2, cwd=tmp_path, timeout_s=600)
    assert out.returncode == 0, out.stderr[-3000:]
    largest = [line for line in out.stdout.splitlines() if line.startswith("largest relative error: ")]
    assert len(largest) == 1 and float(largest[0].split()[3]) <= 1e-4
    assert out.stdout.rstrip().endswith("check passed")


def test_the_trainer_script_on_plans_mixing_allgather_and_ulysses_passes_its_check(tmp_path: Path) -> None:
    # DP1 x CP4, sequences of 3-250 tokens in buckets of 64: the first step's plan shards some microbatches
    # over 2 GPUs with the all-gather and some over 4 with Ulysses (K/V heads copied), and equals the plain step
    data = write_mixed_rows(tmp_path / "train.jsonl")
    run_mixed(
        "hf_trainer.py",
        ["--data", str(data), "--global-batch-size", "16", "--bucket-tokens", "64", "--max-steps", "2",
         "--output-dir", str(tmp_path / "out")],
        tmp_path,
    )  # fmt: skip

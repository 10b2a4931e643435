"""``examples/torchrun_train.py``: a plain PyTorch loop under plans, run as users run it (``torchrun
--standalone --nproc-per-node 4``, gloo on CPU), with DDP and with FSDP2; its first step equals the plain
single-process Hugging Face step."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.test_links import ROOT
from tests.examples.test_hf_trainer import write_rows
from tests.launch import run_torchrun


@pytest.mark.parametrize("grad_sync", ["ddp", "fsdp"])
def test_the_torchrun_loop_passes_its_check(tmp_path: Path, grad_sync: str) -> None:
    data = write_rows(tmp_path / "train.jsonl", n=64, seed=3)
    args = [
        "--model-config", str(ROOT / "examples" / "models" / "qwen2-tiny.json"), "--data", str(data),
        "--dp", "2", "--cp", "2", "--global-batch-size", "16", "--bucket-tokens", "64", "--steps", "2",
        "--grad-sync", grad_sync, "--check",
    ]  # fmt: skip
    out = run_torchrun(ROOT / "examples" / "torchrun_train.py", args, nproc=4, cwd=tmp_path, timeout_s=600)
    assert out.returncode == 0, out.stderr[-3000:]
    losses = [line for line in out.stdout.splitlines() if line.startswith("losses: ")]
    assert len(losses) == 1 and len(losses[0].split()) == 3
    largest = [line for line in out.stdout.splitlines() if line.startswith("largest relative error: ")]
    assert len(largest) == 1 and float(largest[0].split()[3]) <= 1e-4
    assert f"check ({grad_sync})" in out.stdout
    assert out.stdout.rstrip().endswith("check passed")


def test_the_torchrun_loop_on_plans_mixing_allgather_and_ulysses_passes_its_check(tmp_path: Path) -> None:
    # the data and profile of the Trainer's mixed-modes case, DDP
    from tests.examples.mixed_modes import run_mixed, write_mixed_rows

    data = write_mixed_rows(tmp_path / "train.jsonl")
    run_mixed(
        "torchrun_train.py",
        ["--data", str(data), "--global-batch-size", "16", "--bucket-tokens", "64", "--steps", "2",
         "--grad-sync", "ddp"],
        tmp_path,
    )  # fmt: skip

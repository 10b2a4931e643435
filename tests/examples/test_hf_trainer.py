"""``examples/hf_trainer.py``: a stock Hugging Face Trainer script under plans, run as users run it
(``torchrun --standalone --nproc-per-node 4``, gloo on CPU), whose first step equals the plain step."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

from tests.docs.test_links import ROOT


def write_rows(path: Path, *, n: int, seed: int, vocab: int = 128) -> Path:
    rng = random.Random(seed)
    lengths = [3, 5, 9, 17, 30, 60, 100, 120]
    rows = [{"input_ids": [rng.randrange(vocab) for _ in range(rng.choice(lengths))]} for _ in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_trainer_script_under_torchrun_passes_its_check(tmp_path: Path) -> None:
    data = write_rows(tmp_path / "train.jsonl", n=64, seed=3)
    exe = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert exe is not None
    cmd = [
        exe, "--standalone", "--nproc-per-node", "4", str(ROOT / "examples" / "hf_trainer.py"),
        "--model-config", str(ROOT / "examples" / "models" / "qwen2-tiny.json"), "--data", str(data),
        "--dp", "2", "--cp", "2", "--global-batch-size", "16", "--bucket-tokens", "64", "--max-steps", "2",
        "--check", "--output-dir", str(tmp_path / "out"),
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    losses = [line for line in out.stdout.splitlines() if line.startswith("losses: ")]
    assert len(losses) == 1 and len(losses[0].split()) == 3  # two steps, their world losses
    largest = [line for line in out.stdout.splitlines() if line.startswith("largest relative error: ")]
    assert len(largest) == 1 and float(largest[0].split()[3]) <= 1e-4
    assert out.stdout.rstrip().endswith("check passed")


def test_a_run_resumed_from_a_trainer_checkpoint_in_new_processes_is_the_straight_run(tmp_path: Path) -> None:
    data = write_rows(tmp_path / "train.jsonl", n=64, seed=5)
    cmd = [
        sys.executable, str(ROOT / "examples" / "hf_trainer.py"), "--resume-check",
        "--model-config", str(ROOT / "examples" / "models" / "qwen2-tiny.json"), "--data", str(data),
        "--dp", "2", "--cp", "2", "--global-batch-size", "16", "--bucket-tokens", "64", "--max-steps", "4",
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path, check=False)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    straight = next(x for x in lines if x.startswith("losses straight: ")).split()[2:]
    resumed = next(x for x in lines if x.startswith("losses resumed: ")).split()[2:6]
    assert straight == resumed and len(straight) == 4
    assert "largest loss difference 0.000e+00, largest final weight difference 0.000e+00" in out.stdout  # CPU: bitwise
    assert out.stdout.rstrip().endswith("check passed")

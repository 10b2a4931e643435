"""bench/gpu_check.sh (``make gpu-check``) on a machine without a GPU: one line, exit 0, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the script runs the whole acceptance")
def test_without_a_gpu_it_stops_with_one_line_and_writes_nothing(tmp_path: Path) -> None:
    out_dir = tmp_path / "gpu-check"
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_check.sh"), str(out_dir)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0
    assert done.stderr.count("\n") == 1 and "needs a CUDA GPU" in done.stderr and done.stdout == ""
    assert not out_dir.exists()


def test_without_an_output_folder_it_says_how_to_call_it() -> None:
    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh")], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "usage: bench/gpu_check.sh OUT_DIR" in done.stderr


def test_an_interpreter_without_torch_is_named_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": "false"}  # an "interpreter" that can import nothing
    done = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_check.sh"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "false cannot import torch; set PYTHON" in done.stderr and not (tmp_path / "out").exists()


def test_the_calibration_step_alone_writes_its_line_and_the_calibrated_profile(tmp_path: Path) -> None:
    """GPU_CHECK_ONLY runs one step; the smoke run's calibration: tiny model on the CPU, the same commands."""
    import json
    import re

    from skrull.solver.profile import profile_from_dict

    out_dir = tmp_path / "gpu-check"
    env = {
        **os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT), "GPU_CHECK_CPU_SMOKE": "1",
        "GPU_CHECK_ONLY": "calibration",
    }  # fmt: skip
    done = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_check.sh"), str(out_dir)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    summary = (out_dir / "summary.md").read_text().splitlines()
    assert len(summary) == 3 and summary[2].startswith("| calibration | 0 |")  # the header, then that step only
    line = (out_dir / "calibration.txt").read_text().strip()
    assert re.fullmatch(
        r"calibration: median microbatch error \d+\.\d% -> \d+\.\d% over \d+ microbatches; "
        r"iteration estimate error \d+\.\d% -> \d+\.\d%",
        line,
    )
    profile = json.loads((out_dir / "qwen2.5-0.5b.calibrated.json").read_text())
    assert profile["calibrated"]["from"] == "h100-80g/qwen2.5-0.5b" and profile_from_dict(profile).microbatch_ms >= 0

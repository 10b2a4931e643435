"""FSDP through the Trainer's own settings (``TrainingArguments(fsdp=..., fsdp_config=...)``) under plans:
refused on CPUs, where accelerate would silently wrap the model in DDP instead; accelerate's FSDP2 path
(taken on CPUs as it runs on GPUs: tests/worker/hf/torchrun_trainer_fsdp.py) trains the plain step; FSDP1 is
refused naming the version. Real ``torchrun``, 2 gloo processes."""

from __future__ import annotations

from pathlib import Path

from tests.launch import run_torchrun

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def run(case: str, tmp_path: Path) -> list[str]:
    out = run_torchrun(HERE / "torchrun_trainer_fsdp.py", [case], nproc=2, cwd=tmp_path, timeout_s=300)
    assert out.returncode == 0, out.stderr[-3000:]
    # each rank's own file: two ranks printing to torchrun's one pipe interleaved within a line under load
    by_rank = [(tmp_path / f"report-{rank}.txt").read_text(encoding="utf-8").splitlines() for rank in (0, 1)]
    assert by_rank[0] == by_rank[1] and len(by_rank[0]) == 1, by_rank  # every rank, the same one line
    return by_rank[0]


def test_fsdp_on_cpus_is_refused_naming_the_setting(tmp_path: Path) -> None:
    (line,) = run("cpu", tmp_path)
    assert line.startswith("refused: fsdp=True: accelerate applies FSDP only on accelerators"), line
    assert "MULTI_CPU" in line and "wrap the model in DDP" in line


def test_accelerates_fsdp2_trains_the_plain_step(tmp_path: Path) -> None:
    (line,) = run("forced-2", tmp_path)
    words = line.split()
    assert words[:2] == ["trained", "FSDPLlamaForCausalLM"], line  # accelerate's fully_shard, not DDP
    assert float(words[2]) <= 1e-4, line


def test_fsdp1_is_refused_naming_the_version(tmp_path: Path) -> None:
    (line,) = run("forced-1", tmp_path)
    assert line.startswith("refused: fsdp_config version 1"), line

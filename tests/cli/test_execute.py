"""``skrull execute``: real processes, a passing and a failing check, one clear line for every mistake."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.piped import PHASE, run_piped, skrull_argv
from tests.cli.test_main import EXAMPLES, skrull
from tests.conftest import HAND_PROFILE


@pytest.fixture
def small_request(tmp_path: Path) -> Path:
    """DP1 x CP2, bucket 40: the 70-token sequence is sharded next to local ones."""
    path = tmp_path / "small.json"
    doc = {
        "batches": [[70, 9, 25, 3, 31]],
        "parallel": {"dp": 1, "cp": 2},
        "profile": {**HAND_PROFILE, "memory": {"bucket_tokens": 40}},
        "solver": "skrull",
    }
    path.write_text(json.dumps(doc))
    return path


def test_check_passes_and_prints_errors_per_tensor(small_request: Path) -> None:
    out = skrull("execute", "--request", str(small_request), "--world-size", "2", "--backend", "gloo", "--check")
    assert out.returncode == 0, out.stderr
    assert "kernel reference" in out.stdout
    assert "check passed: 6 tensors within tolerance" in out.stdout
    rows = [line for line in out.stdout.splitlines() if line.startswith("| grad input")]
    assert len(rows) == 1 and float(rows[0].split("|")[2]) <= 1e-4
    ranks = [line for line in out.stdout.splitlines() if line.startswith("|    ")]
    assert len(ranks) == 2


def test_check_beyond_tolerance_exits_1_with_one_line(small_request: Path) -> None:
    out = skrull(
        "execute",
        "-r",
        str(small_request),
        "--backend",
        "gloo",
        "--check",
        "--tolerance",
        "1e-15",
    )
    assert out.returncode == 1
    assert "NO" in out.stdout
    # the last line of stderr is the one error; the lines before it are the run's progress
    *progress, last = out.stderr.strip().splitlines()
    assert last.startswith("skrull: error: check failed")
    assert all(PHASE.match(line) for line in progress), progress


def test_a_piped_run_says_each_phase_as_it_starts(small_request: Path) -> None:
    run = run_piped(skrull_argv("execute", "-r", str(small_request), "--backend", "gloo", "--check", "--warmup", "2"))
    assert run.returncode == 0, run.lines
    assert run.running_after_first_line, run.lines
    assert run.lines[0] == "skrull execute: planning 1 batch(es) with skrull"
    assert run.phases() == [
        "skrull execute: planning 1 batch(es) with skrull",
        "skrull execute: starting 2 processes (gloo): 2 warm-up pass(es), then the timed one",
        "skrull execute: [1/3] warm-up pass over 1 iteration(s)",
        "skrull execute: [2/3] warm-up pass over 1 iteration(s)",
        "skrull execute: [3/3] timed pass over 1 iteration(s)",
        "skrull execute: checking 5 sequences, each alone in one process",
    ]
    # the phases come before what they announce: the check's line before the check's table
    assert run.lines.index(run.phases()[-1]) < next(i for i, x in enumerate(run.lines) if x.startswith("check: "))
    assert run.lines[-1] == "check passed: 6 tensors within tolerance"


def test_no_progress_prints_only_the_report(small_request: Path) -> None:
    out = skrull("execute", "-r", str(small_request), "--backend", "gloo", "--no-progress", "--warmup", "0")
    assert out.returncode == 0 and out.stderr == "", out.stderr


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--world-size", "3"], "--world-size: 3: must equal parallel.dp * parallel.cp = 4"),
        (["--backend", "mpi"], "--backend: 'mpi': unknown backend"),
        (["--backend", "nccl"], "--backend: 'nccl': needs CUDA GPUs"),
        (["--cp-modes", "ring"], "--cp-modes[0]: 'ring': must be one of allgather, ulysses"),
        (["--kv-heads", "3"], "--kv-heads: 3: must divide --heads (4)"),
        (["--dtype", "bfloat16"], "--dtype: 'bfloat16': gloo runs on CPU"),
        (["--solver", "magic"], "solver: 'magic': unknown solver"),
        (["--kernel", "flash-attn"], "kernel: 'flash-attn': not usable: needs CUDA, not cpu"),
    ],
)
def test_mistakes_end_with_one_line_naming_the_field(extra: list[str], message: str) -> None:
    out = skrull("execute", "--request", str(EXAMPLES / "tiny-cpu-dp2-cp2.json"), *extra)
    assert out.returncode == 2, out.stdout
    assert out.stderr.startswith("skrull: error: ") and out.stderr.strip().count("\n") == 0
    assert message in out.stderr


def test_a_plan_mixing_allgather_and_ulysses_passes_the_check(tmp_path: Path) -> None:
    """skrull's DACP picks the mode per microbatch (here Ulysses for the 70- and 75-token shards, all-gather
    for the 44-token one, whose all-to-all's fixed cost is higher); the processes run each in its mode."""
    from skrull.solver.io import request_from_dict
    from skrull.solver.planning import solve

    doc = {
        "batches": [[70, 9, 25, 3, 31, 66, 12, 5, 18, 44]],
        "parallel": {"dp": 2, "cp": 2},
        "profile": {
            **HAND_PROFILE,
            "comm": {"bytes_per_token": 2**20, "ms_per_mib": 0.01, "fixed_ms": 0.2},
            "memory": {"bucket_tokens": 40},
            "heads": {"attention": 4, "kv": 2},
            "comm_a2a": {"bytes_per_token": 2**20, "ms_per_mib": 0.001, "fixed_ms": 0.8},
        },
        "solver": "skrull",
        "cp_modes": ["allgather", "ulysses"],
    }
    modes = {mb.mode for it in solve(request_from_dict(doc)).iterations for mb in it.microbatches if mb.sharded}
    assert modes == {"allgather", "ulysses"}
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(doc))
    out = skrull("execute", "--request", str(path), "--world-size", "4", "--backend", "gloo", "--check")
    assert out.returncode == 0, out.stderr
    assert "check passed" in out.stdout


@pytest.mark.parametrize("command", ["execute", "finetune"])
def test_the_removed_run_level_cp_mode_says_to_plan_with_cp_modes(command: str) -> None:
    """Each microbatch runs its plan's mode: ``--cp-mode`` (which overrode every all-gather microbatch) is a
    usage error that names what to use instead, before anything is planned or spawned."""
    model = ["-m", str(EXAMPLES.parent / "models" / "qwen2-tiny.json")] if command == "finetune" else []
    out = skrull(command, *model, "-r", str(EXAMPLES / "tiny-cpu-dp2-cp2.json"), "--cp-mode", "ulysses")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().count("\n") == 0
    assert f"skrull {command}: error: --cp-mode was removed" in out.stderr
    assert "plan with --cp-modes ulysses" in out.stderr

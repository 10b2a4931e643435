"""``skrull finetune``: real gloo processes, a passing and a failing check, one clear line per mistake."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from skrull.solver.profile import profile_from_dict
from tests.cli.piped import PHASE, run_piped, skrull_argv
from tests.cli.test_main import EXAMPLES, ROOT, skrull
from tests.conftest import HAND_PROFILE

MODELS = ROOT / "examples" / "models"


@pytest.fixture
def wide_request(tmp_path: Path) -> Path:
    """DP2 x CP2, bucket 64: dynamic-cp shards the 120- and 100-token sequences over all 4 GPUs."""
    path = tmp_path / "wide.json"
    doc = {
        "batches": [[120, 9, 100, 5, 30, 2, 60, 17]],
        "parallel": {"dp": 2, "cp": 2},
        "profile": {**HAND_PROFILE, "memory": {"bucket_tokens": 64}},
        "solver": "dynamic-cp",
    }
    path.write_text(json.dumps(doc))
    return path


def test_check_passes_on_groups_wider_than_cp(wide_request: Path) -> None:
    out = skrull(
        "finetune",
        "--model-config",
        str(MODELS / "qwen2-tiny.json"),
        "--request",
        str(wide_request),
        "--world-size",
        "4",
        "--backend",
        "gloo",
        "--steps",
        "2",
        "--check",
        "--progress",
    )
    assert out.returncode == 0, out.stderr
    # progress on stderr: the launch, then rank 0's bar over the steps (stdout stays the report)
    assert "skrull finetune: starting 4 processes (gloo), plan dynamic-cp" in out.stderr
    bar = [x for x in out.stderr.replace("\r", "\n").splitlines() if "skrull finetune: 100%" in x]
    assert bar and "2/2" in bar[-1] and "step 1: loss" in bar[-1]
    assert "plan: dynamic-cp" in out.stdout and "2 microbatch(es) on groups wider than CP" in out.stdout
    largest = [line for line in out.stdout.splitlines() if line.startswith("largest relative error: ")]
    assert len(largest) == 1 and float(largest[0].split()[3]) <= 1e-4
    assert out.stdout.rstrip().endswith("check passed")
    steps = [line for line in out.stdout.splitlines() if line.startswith("|    ")]
    assert len(steps) == 4  # two steps run, two steps checked


def test_check_beyond_tolerance_prints_check_failed_and_exits_1() -> None:
    out = skrull(
        "finetune",
        "-m",
        str(MODELS / "llama-tiny.json"),
        "-r",
        str(EXAMPLES / "tiny-cpu-dp2-cp2.json"),
        "--solver",
        "skrull",
        "--check",
        "--tolerance",
        "1e-15",
    )
    assert out.returncode == 1, out.stderr
    assert "check failed" in out.stdout
    # the last line of stderr is the one error; the lines before it are the run's progress
    *progress, last = out.stderr.strip().splitlines()
    assert last.startswith("skrull: error: check failed")
    assert all(PHASE.match(line) for line in progress) and len(progress) == 5, progress


def test_a_piped_run_says_each_phase_as_it_starts() -> None:
    run = run_piped(
        skrull_argv(
            "finetune",
            "-m",
            str(MODELS / "llama-tiny.json"),
            "-r",
            str(EXAMPLES / "tiny-cpu-dp2-cp2.json"),
            "--solver",
            "skrull",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--check",
        )
    )
    assert run.returncode == 0, run.lines
    assert run.running_after_first_line, run.lines
    phases = run.phases()
    assert run.lines[0] == phases[0] == "skrull finetune: planning 2 batch(es) with skrull"
    assert phases[1:3] == [
        "skrull finetune: starting 4 processes (gloo), plan skrull",
        "skrull finetune: building the model",
    ]
    assert [re.sub(r"loss \d+\.\d+", "loss <F>", x) for x in phases[3:]] == [
        "skrull finetune: [1/3] warm-up -1: loss <F>",
        "skrull finetune: [2/3] step 0: loss <F>",
        "skrull finetune: [3/3] step 1: loss <F>",
        "skrull finetune: checking 2 step(s) against the plain step in one process",
    ]
    # each phase is announced before its report: the steps before the step table, the check before its table
    assert run.lines.index(phases[-2]) < run.lines.index(
        "| step | iteration | target tokens | loss | step ms (slowest rank) | compiles |"
    )
    assert run.lines.index(phases[-1]) < next(i for i, x in enumerate(run.lines) if x.startswith("check: "))
    assert run.lines[-1] == "check passed"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--world-size", "3"], "--world-size: 3: must equal parallel.dp * parallel.cp = 4"),
        (["--backend", "nccl"], "--backend: 'nccl': needs CUDA GPUs"),
        (["--steps", "0"], "--steps: 0: must be an integer >= 1"),
        (["--cp-modes", "ring"], "--cp-modes[0]: 'ring': must be one of allgather, ulysses"),
        (["--dtype", "bfloat16"], "--dtype: 'bfloat16': gloo runs on CPU"),
        (["--solver", "magic"], "solver: 'magic': unknown solver"),
        (["--lr", "nan"], "--lr: nan: must be a number > 0"),
        (["--loss-chunk-tokens", "0"], "--loss-chunk-tokens: 0: must be an integer >= 1"),
    ],
)
def test_mistakes_end_with_one_line_naming_the_field(extra: list[str], message: str) -> None:
    out = skrull(
        "finetune", "-m", str(MODELS / "qwen2-tiny.json"), "-r", str(EXAMPLES / "tiny-cpu-dp2-cp2.json"), *extra
    )
    assert out.returncode == 2, out.stdout
    assert out.stderr.startswith("skrull: error: ") and out.stderr.strip().count("\n") == 0
    assert message in out.stderr


def test_a_model_config_that_cannot_run_is_refused(tmp_path: Path) -> None:
    config = json.loads((MODELS / "qwen2-tiny.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "model_type": "bert"}))
    out = skrull("finetune", "-m", str(path), "-r", str(EXAMPLES / "tiny-cpu-dp2-cp2.json"))
    assert out.returncode == 2
    assert "--model-config.model_type: 'bert': unsupported" in out.stderr


def test_a_plan_file_is_validated_against_the_request(tmp_path: Path) -> None:
    plan = skrull("plan", "-r", str(EXAMPLES / "contract-example.json"), "--compact")
    assert plan.returncode == 0, plan.stderr
    path = tmp_path / "plan.json"
    path.write_text(plan.stdout)
    out = skrull("finetune", "-m", str(MODELS / "qwen2-tiny.json"), "-r", str(EXAMPLES / "tiny-cpu-dp2-cp2.json"),
                 "--plan", str(path))  # fmt: skip
    assert out.returncode == 2
    # one error line, after the progress line that says the plan is being read (stderr is a pipe here)
    *progress, last = out.stderr.strip().splitlines()
    assert last.startswith("skrull: error: invalid plan: parallel is dp=4 cp=8, request has dp=2 cp=2"), last
    assert progress == [f"skrull finetune: reading the plan {path}"], progress


@pytest.mark.parametrize("grad_sync", ["ddp", "fsdp"])
def test_ddp_and_fsdp2_give_the_plain_steps_gradients_on_groups_wider_than_cp(
    wide_request: Path, grad_sync: str
) -> None:
    # gradients summed by the framework (DDP no_sync + a summing comm hook; FSDP2 fully_shard with
    # equal, aligned microbatches: the flexible plan's groups meet in every forward) equal the plain step's
    out = skrull(
        "finetune", "--model-config", str(MODELS / "qwen2-tiny.json"), "--request", str(wide_request),
        "--world-size", "4", "--backend", "gloo", "--steps", "2", "--check", "--grad-sync", grad_sync,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "2 microbatch(es) on groups wider than CP" in out.stdout
    largest = [line for line in out.stdout.splitlines() if line.startswith("largest relative error: ")]
    assert len(largest) == 1 and float(largest[0].split()[3]) <= 1e-4
    assert out.stdout.rstrip().endswith("check passed")


def test_grad_sync_mistakes_are_one_line() -> None:
    base = ["finetune", "-m", str(MODELS / "qwen2-tiny.json"), "-r", str(EXAMPLES / "tiny-cpu-dp2-cp2.json")]
    out = skrull(*base, "--grad-sync", "horovod")
    assert out.returncode == 2 and "--grad-sync: 'horovod': must be one of allreduce, ddp, fsdp" in out.stderr
    out = skrull(*base, "--grad-sync", "ddp", "--loss-chunk-tokens", "0")
    assert out.returncode == 2 and "--loss-chunk-tokens: 0: must be an integer >= 1" in out.stderr


def test_calibrate_replans_with_the_run_profile_passes_the_check_and_ends_with_the_calibration_line(
    tmp_path: Path,
) -> None:
    request = tmp_path / "request.json"
    batches = [[40, 5, 100, 3, 17, 120, 9, 33], [90, 12, 50, 7, 30, 6, 64, 21], [25, 80, 11, 44, 70, 2, 19, 56]]
    doc = {"batches": batches, "parallel": {"dp": 2, "cp": 1}, "profile": "h100-80g/qwen2.5-0.5b", "solver": "auto",
           "bucket_tokens": 128, "time_budget_s": 0.1, "deterministic": True}  # fmt: skip
    request.write_text(json.dumps(doc))
    out_profile = tmp_path / "calibrated.json"
    out = skrull(
        "finetune", "--model-config", str(MODELS / "qwen2-tiny.json"), "--request", str(request), "--world-size", "2",
        "--steps", "6", "--check", "--calibrate", "--calibrated-profile-out", str(out_profile),
        "--calibration-records-out", str(tmp_path / "records.json"),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert re.fullmatch(
        r"calibration: median microbatch error \d+\.\d% -> \d+\.\d% over \d+ microbatches; "
        r"iteration estimate error \d+\.\d% -> \d+\.\d%",
        lines[-1],
    )
    # before it, what no fit of the model's form explains of this run's timings
    assert re.fullmatch(r"calibration noise floor: \d+\.\d% per microbatch, \d+\.\d% per iteration \(.*\)", lines[-2])
    assert "check passed" in out.stdout  # re-planned steps train the same global batches exactly
    assert "+calibrated" in out.stdout  # later steps ran plans made with the calibrated profile
    profile = json.loads(out_profile.read_text())
    assert profile["calibrated"]["from"] == "h100-80g/qwen2.5-0.5b" and profile["calibrated"]["microbatches"] >= 6
    assert profile_from_dict(profile).microbatch_ms >= 0  # an ordinary profile the planners read
    # every measured microbatch, with the profile its plan was made with: the starting one, then the fits
    records = json.loads((tmp_path / "records.json").read_text())
    assert len(records) >= 6 and all(r["ms"] > 0 and len(r["local"]) == len(r["ranks"]) for r in records)
    assert records[0]["profile"] == "h100-80g/qwen2.5-0.5b" and records[-1]["profile"].endswith("+calibrated")
    # read back whole: what the bench and a reader rebuild is what was measured
    from skrull.worker.calibration import MeasuredMicrobatch

    assert [MeasuredMicrobatch.from_record(r).to_record(r["profile"]) for r in records] == records


def test_calibrated_profile_out_needs_calibrate(tmp_path: Path) -> None:
    out = skrull(
        "finetune", "--model-config", str(MODELS / "qwen2-tiny.json"), "--request",
        str(EXAMPLES / "tiny-cpu-dp2-cp2.json"), "--calibrated-profile-out", str(tmp_path / "p.json"),
    )  # fmt: skip
    assert out.returncode != 0 and "--calibrated-profile-out" in out.stderr and "needs --calibrate" in out.stderr


def test_the_router_loss_trains_per_microbatch_when_asked_and_is_refused_otherwise(wide_request: Path) -> None:
    """A mixture of experts with ``output_router_logits: true``: refused naming the option; with
    ``--router-aux-loss per-microbatch`` each step (groups sharding sequences over 4 GPUs) equals the plain
    step plus Hugging Face's own router loss of each of the plan's microbatches."""
    config = ROOT / "tests" / "conformance" / "models" / "qwen2-moe-router-aux.json"
    argv = ["finetune", "--model-config", str(config), "--request", str(wide_request), "--world-size", "4",
            "--backend", "gloo", "--grad-sync", "fsdp", "--check"]  # fmt: skip
    refused = skrull(*argv)
    assert refused.returncode != 0 and 'router_aux_loss="per_microbatch"' in refused.stderr
    out = skrull(*argv, "--router-aux-loss", "per-microbatch")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "loss includes the router aux loss, per_microbatch" in out.stdout
    assert out.stdout.rstrip().endswith("check passed")

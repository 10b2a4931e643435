"""The installed ``skrull`` command: plans, tables, and one clear line for every user mistake."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from skrull.solver.io import plan_from_dict, read_json, request_from_dict
from skrull.solver.validate import plan_problems

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "requests"


def skrull(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("skrull", path=str(Path(sys.executable).parent))
    cmd = [exe] if exe else [sys.executable, "-m", "skrull.cli.main"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_plan_prints_a_valid_contract_plan() -> None:
    out = skrull("plan", "--request", str(EXAMPLES / "contract-example.json"))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["schema"] == "skrull.plan/v1" and doc["solver"] == "auto"
    request = request_from_dict(read_json(EXAMPLES / "contract-example.json"))
    assert plan_problems(plan_from_dict(doc), request) == []


def test_plan_writes_file_with_chosen_solver_and_validate_accepts_it(tmp_path: Path) -> None:
    target = tmp_path / "plan.json"
    out = skrull("plan", "-r", str(EXAMPLES / "default.json"), "--solver", "packed", "-o", str(target))
    assert out.returncode == 0, out.stderr
    assert json.loads(target.read_text())["solver"] == "packed"
    check = skrull("validate", "--request", str(EXAMPLES / "default.json"), "--plan", str(target))
    assert check.returncode == 0 and check.stdout.startswith("valid:")


def test_validate_rejects_a_tampered_plan(tmp_path: Path) -> None:
    out = skrull("plan", "-r", str(EXAMPLES / "contract-example.json"))
    doc = json.loads(out.stdout)
    doc["iterations"][0]["microbatches"][0]["estimated_ms"] += 1.0
    target = tmp_path / "bad.json"
    target.write_text(json.dumps(doc))
    check = skrull("validate", "-r", str(EXAMPLES / "contract-example.json"), "-p", str(target))
    assert check.returncode == 2
    assert "invalid plan" in check.stderr and "estimated_ms" in check.stderr


def test_compare_prints_one_row_per_planner() -> None:
    out = skrull("compare", "--request", str(EXAMPLES / "default.json"), "--time-budget-s", "0.5")
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and "solver" not in line]
    # a row that defers sequences is marked "*" (the legend under the table says what that means)
    assert [r.split("|")[1].strip().removesuffix(" *") for r in rows] == [
        "skrull",
        "ilp(scip)",
        "ilp(cpsat)",
        "ilp-flex",
        "auto",
        "deepspeed",
        "packed",
        "sorted",
        "round-robin",
        "wlb",
        "dynamic-cp",
        "hydraulis",
        "verl-kk",
    ]
    deepspeed = next(r for r in rows if "deepspeed" in r)
    assert "1.00x" in deepspeed
    assert "Legend" in out.stdout and "no plan beats" in out.stdout and "(any layout)" in out.stdout


def test_compare_from_a_dataset_as_json() -> None:
    out = skrull(
        "compare",
        "--dataset",
        "sharegpt",
        "--dp",
        "2",
        "--cp",
        "4",
        "--per-rank",
        "16",
        "--time-budget-s",
        "0.5",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    skrull_row = next(r for r in rows if r["solver"] == "skrull")
    assert skrull_row["speedup"] > 1.0 and skrull_row["ratio_to_bound"] >= 1.0


def test_request_command_writes_a_loadable_request(tmp_path: Path) -> None:
    target = tmp_path / "req.json"
    out = skrull(
        "request",
        "--dataset",
        "llama3-sft-mix",
        "--dp",
        "2",
        "--cp",
        "2",
        "--per-rank",
        "8",
        "--batches",
        "3",
        "-o",
        str(target),
    )
    assert out.returncode == 0, out.stderr
    request = request_from_dict(json.loads(target.read_text()))
    assert [len(b) for b in request.batches] == [16, 16, 16]


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ({"batches": [], "parallel": {"dp": 1, "cp": 1}}, "batches: []"),
        ({"batches": [[3, 0]], "parallel": {"dp": 1, "cp": 1}}, "batches[0][1]: 0"),
        ({"batches": [[3, -4]], "parallel": {"dp": 1, "cp": 1}}, "batches[0][1]: -4"),
        ({"batches": [[3, 1.5]], "parallel": {"dp": 1, "cp": 1}}, "batches[0][1]: 1.5"),
        ({"batches": [[3]], "parallel": {"dp": 0, "cp": 1}}, "parallel.dp: 0"),
        ({"batches": [[3]], "parallel": {"dp": 1, "cp": 0}}, "parallel.cp: 0"),
        ({"batches": [[3]], "parallel": {"dp": 1, "cp": 1}, "profile": "tpu/x"}, "profile: 'tpu/x'"),
        ({"batches": [[3]], "parallel": {"dp": 1, "cp": 1}, "solver": "magic"}, "solver: 'magic'"),
        ({"batches": [[3, 60000]], "parallel": {"dp": 1, "cp": 2}}, "sequence 1 has 60000 tokens"),
    ],
)
def test_bad_request_gives_one_clear_line(tmp_path: Path, doc: dict, needle: str) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    out = skrull("plan", "--request", str(path))
    assert out.returncode == 2
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("skrull: error: ") and needle in lines[0], out.stderr


def test_malformed_json_and_missing_file_give_one_clear_line(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text("{not json")
    out = skrull("plan", "--request", str(path))
    assert out.returncode == 2 and "malformed JSON at line 1" in out.stderr and len(out.stderr.splitlines()) == 1
    out = skrull("plan", "--request", str(tmp_path / "missing.json"))
    assert out.returncode == 2 and "no such file" in out.stderr


def test_profiles_lists_bundled_and_shows_one() -> None:
    out = skrull("profiles")
    assert "h100-80g/qwen2.5-0.5b" in out.stdout.split()
    shown = json.loads(skrull("profiles", "h100-80g/qwen2.5-7b").stdout)
    assert shown["memory"]["bucket_tokens"] == 13000


def test_profiles_long_tells_measured_from_derived_and_survives_a_broken_user_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from skrull.cli.main import main

    (tmp_path / "lab__broken.json").write_text('{"name": "lab/broken"}')
    monkeypatch.setenv("SKRULL_PROFILES_DIR", str(tmp_path))
    assert main(["profiles", "--long"]) == 0
    rows = {line.split("|")[1].strip(): line for line in capsys.readouterr().out.splitlines()[2:]}
    assert "measured on NVIDIA H100 80GB HBM3" in rows["h100-80g-measured/qwen2.5-0.5b"]
    assert "8.0% median error (pass)" in rows["h100-80g-measured/qwen2.5-0.5b"]
    assert "(fail)" in rows["h100-80g-measured/qwen2.5-7b"]
    assert "| derived | 26000 |" in rows["h100-80g/qwen2.5-0.5b"]
    assert "unreadable: " in rows["lab/broken"] and "compute" in rows["lab/broken"]


def test_version_names_the_installed_distribution() -> None:
    from importlib.metadata import version

    out = skrull("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"skrull {version('skrull')}"


def test_the_readme_counts_the_bundled_profiles() -> None:
    from skrull.solver.profile import bundled_profile_names

    words = {4: "Four", 5: "Five", 6: "Six", 7: "Seven", 8: "Eight", 9: "Nine", 10: "Ten"}
    count = len(bundled_profile_names())
    assert f"{words[count]} are bundled" in (ROOT / "README.md").read_text()


def test_request_says_how_many_sampled_lengths_it_cut_to_the_group(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    shape = ("--dataset", "chatqa2-long-sft", "--dp", "2", "--per-rank", "64")
    cut = skrull("request", *shape, "--cp", "1", "-o", str(out))
    doc = read_json(str(out))
    at_limit = sum(1 for b in doc["batches"] for n in b if n == 26000)
    assert cut.returncode == 0 and at_limit > 0
    assert f"{at_limit} of 128 sampled lengths were cut to cp x bucket_tokens = 26000" in cut.stderr
    roomy = skrull("request", "--dataset", "chatqa2-long-sft", "--dp", "2", "--cp", "64", "--per-rank", "8")
    assert roomy.returncode == 0 and "were cut" not in roomy.stderr


@pytest.mark.parametrize(
    ("profile", "warned"), [("h100-80g-measured/qwen2.5-7b", True), ("h100-80g/qwen2.5-7b", False)]
)
def test_planning_with_a_profile_that_failed_its_own_check_warns(profile: str, warned: bool) -> None:
    out = skrull("plan", "--dataset", "mooncake", "--dp", "1", "--cp", "8", "--per-rank", "8", "--profile", profile)
    assert out.returncode == 0 and plan_from_dict(json.loads(out.stdout)).solver
    assert ("failed its own check (median error 20.7%" in out.stderr) is warned


def test_plan_without_a_budget_gets_one_large_enough_for_the_request(tmp_path: Path) -> None:
    shape = ("--dataset", "mooncake", "--dp", "2", "--cp", "64", "--per-rank", "8192", "--solver", "deepspeed")
    refused = skrull("plan", *shape, "--time-budget-s", "1", "-o", str(tmp_path / "no.json"))
    assert refused.returncode == 2 and "ask for time_budget_s >=" in refused.stderr
    out = skrull("plan", *shape, "-o", str(tmp_path / "plan.json"))
    assert out.returncode == 0, out.stderr
    plan = plan_from_dict(read_json(str(tmp_path / "plan.json")))
    assert sum(len(mb.seq_ids) for it in plan.iterations for mb in it.microbatches) == 16384


@pytest.mark.parametrize(
    ("solver", "status", "gap", "noted"),
    [("ilp", "feasible", 0.298, True), ("ilp", "optimal", 0.0, False), ("auto", "feasible", 0.298, False)],
)
def test_an_exact_plan_stopped_by_its_budget_says_its_gap_and_what_to_raise(
    solver: str, status: str, gap: float, noted: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    import dataclasses

    from skrull.cli.main import _note_if_stopped
    from skrull.solver.planning import solve

    request = request_from_dict(read_json(EXAMPLES / "contract-example.json"))
    request = dataclasses.replace(request, solver="skrull", time_budget_s=None)
    plan = solve(request)
    plan = dataclasses.replace(plan, solver=solver, solve=dataclasses.replace(plan.solve, status=status, gap=gap))
    _note_if_stopped(request, plan)
    said = capsys.readouterr().err
    expected = "skrull: note: ilp stopped at a 29.8% gap to the plan's proven bound when its 1 s budget ran out"
    assert (expected in said and "raise --time-budget-s" in said) is noted
    assert bool(said) is noted


def test_an_exact_plan_solved_in_time_with_ulysses_microbatches_is_proven_and_says_no_budget_ran_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # ilp decides each microbatch's mode in its model: a plan running Ulysses keeps the model's proof
    # (model_bound_ms, "optimal"), and a solve that finished in time prints no note that its budget ran out
    request = {
        "batches": [[30000, 2000, 1000]],
        "parallel": {"dp": 1, "cp": 4},
        "profile": "h100-80g/llama2-7b",
        "solver": "ilp",
        "cp_modes": ["allgather", "ulysses"],
        "deterministic": True,
        "bucket_tokens": 20000,
    }
    (tmp_path / "request.json").write_text(json.dumps(request))
    code, out, err = _run_main(capsys, "plan", "-r", str(tmp_path / "request.json"), "--time-budget-s", "10")
    assert code == 0, err
    plan = json.loads(out)
    assert any(mb.get("mode") == "ulysses" for it in plan["iterations"] for mb in it["microbatches"])
    solve_block = plan["solve"]
    assert solve_block["status"] == "optimal" and solve_block["model_gap"] <= 1e-4
    assert solve_block["model_bound_ms"] <= solve_block["objective_ms"] + 1e-9
    assert "budget ran out" not in err
    # where the solver stopped short, the note says so, with the gap to its own model's bound
    import dataclasses

    from skrull.cli.main import _note_if_stopped

    solved = plan_from_dict(plan)
    short = dataclasses.replace(solved.solve, status="timeout", model_bound_ms=solved.estimated_ms * 0.9, model_gap=0.1)
    _note_if_stopped(request_from_dict(request), dataclasses.replace(solved, solve=short))
    assert "skrull: note: ilp stopped at a 10.0% gap to its model's proven bound" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "at_cp_2"),
    [
        (("--cp-modes", "ulysses", "--solver", "deepspeed"), 2),  # deepspeed plans all-gather only
        (("--solver", "xtuner"), 2),  # xtuner plans ulysses only, the request allows all-gather alone
        (("--solver", "xtuner", "--cp-modes", "ulysses"), 0),  # cp 4 does not divide 14 heads; cp 2 does
    ],
)
def test_request_refuses_what_plan_would_refuse_and_writes_nothing(
    flags: tuple[str, ...], at_cp_2: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "request.json"
    shape = ("request", "--dataset", "sharegpt", "--dp", "2")
    code, _, err = _run_main(capsys, *shape, "--cp", "4", *flags, "-o", str(out))
    assert code == 2 and err.startswith("skrull: error: "), err
    assert "cp_modes" in err or "parallel.cp" in err
    assert not out.exists()
    code, _, err = _run_main(capsys, *shape, "--cp", "2", *flags, "-o", str(out))
    assert code == at_cp_2 and out.exists() is (code == 0), err


def test_an_output_that_cannot_be_written_names_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-such-folder" / "plan.json"
    code, _, err = _run_main(
        capsys, "plan", "-r", str(EXAMPLES / "contract-example.json"), "--solver", "skrull", "-o", str(missing)
    )
    assert code == 2
    assert err.startswith("skrull: error: --output: ") and "cannot be written" in err and "service" not in err


def _run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from skrull.cli.main import main

    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_plan_without_input_names_the_flag_and_no_value(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run_main(capsys, "plan")
    assert code == 2
    assert err == "skrull: error: --request: give a request file (--request FILE) or a dataset (--dataset NAME)\n"


def test_a_request_given_as_the_plan_is_called_a_request(capsys: pytest.CaptureFixture[str]) -> None:
    example = str(EXAMPLES / "contract-example.json")
    code, _, err = _run_main(capsys, "validate", "--request", example, "--plan", example)
    assert code == 2 and "this is a request" in err and "None" not in err


def test_mistyped_subcommands_and_flags_get_the_closest_known_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run_main(capsys, "plna")
    assert code == 2 and "(did you mean plan?)" in err and err.count("\n") == 1
    code, _, err = _run_main(capsys, "plan", "--requets", "x.json")
    assert code == 2 and "unrecognized arguments: --requets" in err and "(did you mean --request?)" in err


def test_compare_takes_solver_lists_with_spaces_and_counts_one_batch_in_the_singular(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = _run_main(
        capsys,
        "compare",
        "--dataset",
        "sharegpt",
        "--dp",
        "1",
        "--cp",
        "2",
        "--per-rank",
        "4",
        "--solvers",
        "skrull, packed",
    )
    assert code == 0, err
    assert out.startswith("4 sequences in 1 batch, DP1 x CP2")
    table = [line for line in out.splitlines() if line.startswith("| ")][1:]
    assert [line.split("|")[1].strip() for line in table] == ["skrull", "packed"]


def test_serve_refuses_a_db_in_a_missing_folder_naming_the_flag(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "jobs.db"
    out = skrull("serve", "--db", str(missing), "--port", "0")
    assert out.returncode == 2
    assert out.stderr.startswith("skrull: error: --db: ") and "does not exist" in out.stderr
    assert not missing.parent.exists()


def test_every_option_of_every_subcommand_says_what_it_is() -> None:
    import argparse

    from skrull.cli.main import build_parser

    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    silent = [
        f"{name} {a.option_strings[0] if a.option_strings else a.dest}"
        for name, sub in commands.choices.items()
        for a in sub._actions
        if not isinstance(a, argparse._HelpAction) and not a.help
    ]
    assert silent == []


def test_lengths_plan_and_request_share_their_defaults() -> None:
    import argparse

    from skrull.cli.main import DATASET_DEFAULTS, build_parser

    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    lengths = commands.choices["lengths"]
    defaults = {a.dest: a.default for a in lengths._actions}
    assert (defaults["dp"], defaults["cp"]) == (DATASET_DEFAULTS["dp"], DATASET_DEFAULTS["cp"]) == (4, 8)
    assert defaults["solver"] == "auto"

"""``skrull derive-profile``: any config.json on any bundled or described GPU, written where the planner
finds it, and one clear line for each mistake."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from skrull.cli.main import main
from skrull.solver.io import plan_from_dict, read_json
from skrull.solver.profile import PROFILES_DIR_ENV, profile_from_dict
from skrull.solver.profiles.derive import MODELS, TrainingSetup, activation_bytes_per_token, derive_profile
from skrull.solver.profiles.gpus import GPUS, gpu_from_figures
from skrull.solver.profiles.hf_config import model_from_hf_config
from tests.solver.profiles.test_hf_config import CONFIGS


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["derive-profile", *args])
    out, err = capsys.readouterr()
    return code, out, err


def write_config(folder: Path, name: str) -> Path:
    path = folder / name / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(CONFIGS[name]), encoding="utf-8")
    return path


@pytest.mark.parametrize("model", sorted(CONFIGS))
@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_every_architecture_on_every_bundled_gpu_is_the_derivation(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, model: str, gpu: str
) -> None:
    config = write_config(tmp_path, model)
    code, out, err = run(capsys, "--hf-config", str(config), "--gpu", gpu)
    expected = derive_profile(model_from_hf_config(CONFIGS[model], name=model), GPUS[gpu])
    if expected.bucket_tokens < 1:  # e.g. Gemma-7B's ZeRO-2 states at DP=4 fill an L40S's 48 GB
        assert (code, out) == (2, "") and "does not fit" in err
        return
    assert code == 0, err
    assert json.loads(out) == json.loads(json.dumps(expected.to_dict()))
    assert profile_from_dict(json.loads(out)).name == f"{gpu}/{model}"


def test_figures_on_the_command_line_describe_a_gpu_without_a_bundled_spec(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = write_config(tmp_path, "mistral-7b-v0.1")
    args = ("--peak-tflops", "400", "--nvlink-gbps", "300", "--memory-gib", "64", "--gpu-name", "mygpu")
    code, out, err = run(capsys, "--hf-config", str(config), *args, "--name", "mistral")
    assert code == 0, err
    doc = json.loads(out)
    gpu = gpu_from_figures(
        name="mygpu", memory_gib=64, peak_bf16_tflops=400, link_bandwidth_gbs=300, source=doc["gpu"]["source"]
    )
    expected = derive_profile(model_from_hf_config(CONFIGS["mistral-7b-v0.1"], name="mistral"), gpu)
    assert doc == json.loads(json.dumps(expected.to_dict()))
    assert doc["name"] == "mygpu/mistral"
    assert "400.0" in doc["gpu"]["source"] and "300.0" in doc["gpu"]["source"]


def test_figures_override_a_bundled_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--model", "qwen2.5-7b", "--gpu", "h100-80g", "--memory-gib", "94")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["name"] == "h100-80g-custom/qwen2.5-7b"
    assert doc["gpu"]["memory_bytes"] == 94 * 2**30
    assert doc["comm"]["ms_per_mib"] == derive_profile(MODELS["qwen2.5-7b"], GPUS["h100-80g"]).comm.ms_per_mib
    # the paper's measured bucket, scaled by free memory: more memory, a bigger bucket
    assert doc["memory"]["bucket_tokens"] > derive_profile(MODELS["qwen2.5-7b"], GPUS["h100-80g"]).bucket_tokens


def test_training_setup_flags_reach_the_static_memory(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--model", "llama2-7b", "--dp", "8", "--zero-stage", "3", "--mfu", "0.5")
    assert code == 0
    expected = derive_profile(MODELS["llama2-7b"], GPUS["h100-80g"], TrainingSetup(dp=8, zero_stage=3, mfu=0.5))
    assert json.loads(out) == json.loads(json.dumps(expected.to_dict()))


def test_output_dir_feeds_the_planner_through_the_profiles_directory_variable(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path, "llama-3-8b")
    folder = tmp_path / "profiles"
    code, out, err = run(capsys, "--hf-config", str(config), "--gpu", "a100-80g", "--output-dir", str(folder))
    assert code == 0, err
    written = folder / "a100-80g__llama-3-8b.json"
    assert out.strip() == f"wrote {written}"
    monkeypatch.setenv(PROFILES_DIR_ENV, str(folder))
    assert main(["profiles"]) == 0
    assert "a100-80g/llama-3-8b" in capsys.readouterr().out.split()
    plan_file = tmp_path / "plan.json"
    argv = ["plan", "--dataset", "sharegpt", "--dp", "2", "--cp", "4", "--per-rank", "8"]
    assert main([*argv, "--profile", "a100-80g/llama-3-8b", "-o", str(plan_file)]) == 0
    plan = plan_from_dict(read_json(plan_file))
    assert plan.iterations


def _error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code, out, err = run(capsys, *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("skrull: error: ")
    return err


def test_mistakes_are_one_line_naming_the_flag_or_key(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = write_config(tmp_path, "gemma-2b")
    assert "--memory-gib" in _error(capsys, "--hf-config", str(config), "--peak-tflops", "100", "--link-gbps", "50")
    assert "--peak-tflops: nan" in _error(capsys, "--gpu", "a100-80g", "--peak-tflops", "nan")
    assert "--link-gbps: -5.0" in _error(capsys, "--link-gbps", "-5", "--peak-tflops", "1", "--memory-gib", "1")
    assert "--gpu: 'v100'" in _error(capsys, "--gpu", "v100")
    assert "--model: 'gpt-9'" in _error(capsys, "--model", "gpt-9")
    assert "--hf-config" in _error(capsys, "--model", "llama2-7b", "--hf-config", str(config))
    assert "no such file" in _error(capsys, "--hf-config", str(tmp_path / "missing.json"))
    bad = tmp_path / "moe.json"
    bad.write_text(json.dumps({**CONFIGS["mistral-7b-v0.1"], "num_local_experts": 8}))
    assert "moe.json: num_local_experts: 8" in _error(capsys, "--hf-config", str(bad))
    (tmp_path / "broken.json").write_text("{")
    assert "malformed JSON" in _error(capsys, "--hf-config", str(tmp_path / "broken.json"))


def test_a_model_that_does_not_fit_says_so(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    huge: dict[str, Any] = {**CONFIGS["llama-3-8b"], "num_hidden_layers": 200}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(huge))
    err = _error(capsys, "--hf-config", str(path), "--gpu", "l40s-48g", "--dp", "1")
    assert "does not fit" in err and "--dp" in err


def test_write_bundled_rewrites_the_bundled_files_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    _error(capsys, "--all", "--write-bundled", "--output-dir", "x")
    code, out, _ = run(capsys, "--all")
    assert code == 0
    assert out.count('"estimated": true') == len(MODELS)


def test_tp_1_is_the_plain_profile_and_tp_2_the_derivation_for_one_gpu_of_the_group(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, plain, _ = run(capsys, "--all")
    assert (code, run(capsys, "--all", "--tp", "1")) == (0, (0, plain, ""))
    code, out, err = run(capsys, "--model", "llama2-13b", "--gpu", "a100-80g", "--tp", "4")
    assert code == 0, err
    setup = TrainingSetup(dp=8, zero_stage=3, tp=4)  # llama2-13b's own setup (solver/profiles/derive.py SETUPS)
    expected = derive_profile(MODELS["llama2-13b"], GPUS["a100-80g"], setup)
    assert json.loads(out) == json.loads(json.dumps(expected.to_dict()))
    assert expected.name == "a100-80g/llama2-13b-tp4" and expected.extra["setup"]["tp"] == 4


def test_a_tp_profile_written_to_a_folder_plans_and_validates(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path, "llama-3-8b")  # 32 heads, 8 K/V heads
    folder = tmp_path / "profiles"
    code, out, err = run(capsys, "--hf-config", str(config), "--tp", "8", "--output-dir", str(folder))
    assert code == 0, err
    assert out.strip() == f"wrote {folder / 'h100-80g__llama-3-8b-tp8.json'}"
    monkeypatch.setenv(PROFILES_DIR_ENV, str(folder))
    request, plan = tmp_path / "request.json", tmp_path / "plan.json"
    argv = ["--dataset", "sharegpt", "--dp", "2", "--cp", "4", "--per-rank", "8"]
    argv += ["--profile", "h100-80g/llama-3-8b-tp8"]
    assert main(["request", *argv, "-o", str(request)]) == 0
    assert main(["plan", "--request", str(request), "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["validate", "--request", str(request), "--plan", str(plan)]) == 0
    assert capsys.readouterr().out.startswith("valid: ")


def test_tp_mistakes_name_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--tp: 3: must divide llama2-7b's 32 attention heads" in _error(capsys, "--model", "llama2-7b", "--tp", "3")
    assert "--tp: 0: must be an integer >= 1" in _error(capsys, "--tp", "0")
    assert "--tp: 4: must divide qwen2.5-0.5b's 14" in _error(capsys, "--all", "--tp", "4")
    assert "--tp: 2: the bundled profiles are for tp 1" in _error(capsys, "--all", "--tp", "2", "--write-bundled")


# -- gathered K/V, topology, overlap, --paper-bucket, cluster flags ------------------------------------------


QWEN_7B = Path(__file__).resolve().parents[2] / "examples" / "models" / "qwen2.5-7b.json"


def _without_names(doc: dict[str, Any]) -> dict[str, Any]:
    """A profile document less what only names it (the profile's and the model's name, the config's file)."""
    out = json.loads(json.dumps(doc))
    out.pop("name")
    out["model"].pop("name")
    out["model"].pop("source")
    return out


@pytest.mark.parametrize("paper", [False, True])
def test_the_same_config_under_two_names_gives_the_same_profile(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, paper: bool
) -> None:
    """Issue: the paper's bucket was looked up by the file's name (13,000 tokens as qwen2.5-7b/config.json,
    5,519 as my-model/config.json). Now the bucket comes from the shape and setup, the paper's only when
    asked, and then for both names."""
    docs = []
    for folder in ("qwen2.5-7b", "my-model"):
        path = tmp_path / folder / "config.json"
        path.parent.mkdir()
        path.write_text(QWEN_7B.read_text(encoding="utf-8"), encoding="utf-8")
        code, out, err = run(capsys, "--hf-config", str(path), *(["--paper-bucket"] if paper else []))
        assert code == 0, err
        docs.append(json.loads(out))
    assert _without_names(docs[0]) == _without_names(docs[1])
    memory = docs[0]["memory"]
    assert memory["bucket_rule"] == ("paper" if paper else "derived")
    assert memory["bucket_tokens"] == (13_000 if paper else memory["derived_bucket_tokens"])
    assert memory["paper_bucket_tokens"] == 13_000  # recorded either way: the shape is the paper's 7B


def test_derive_fills_memory_topology_and_overlap(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--model", "llama2-13b", "--gpu", "h100-80g")
    assert code == 0, err
    doc = json.loads(out)
    model = MODELS["llama2-13b"]
    kv = 2 * model.num_layers * model.num_kv_heads * model.head_dim * 2
    assert doc["memory"]["kv_bytes_per_token"] == kv == 819_200
    assert doc["memory"]["activation_bytes_per_token"] == activation_bytes_per_token(model)
    profile = profile_from_dict(doc)
    assert profile.gathered_kv_ratio == pytest.approx(kv / activation_bytes_per_token(model))
    topology = doc["topology"]
    assert topology["gpus_per_node"] == 8
    assert topology["intra_node"]["allgather_ms_per_mib"] == pytest.approx(2**20 / 360e9 * 1e3, abs=1e-8)
    assert topology["inter_node"]["alltoall_ms_per_mib"] == pytest.approx(2**20 / 45e9 * 1e3, abs=1e-8)
    assert "NDR" in topology["source"] and "NVLink" in topology["source"] and "not aggregated" in topology["source"]
    assert doc["overlap"]["with"] == "local_attention" and doc["overlap"]["ulysses_exposed"] == 0.5
    assert "worker/dacp.py" in doc["overlap"]["source"]
    assert profile_from_dict(json.loads(json.dumps(profile.to_dict()))).to_dict() == profile.to_dict()


def test_tp_divides_the_kv_bytes_by_the_heads_each_rank_holds(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--model", "llama2-7b", "--tp", "4")
    assert code == 0, err
    model = MODELS["llama2-7b"]
    assert json.loads(out)["memory"]["kv_bytes_per_token"] == 2 * model.num_layers * (32 // 4) * model.head_dim * 2


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_every_bundled_gpu_has_published_cluster_figures(capsys: pytest.CaptureFixture[str], gpu: str) -> None:
    code, out, err = run(capsys, "--model", "qwen2.5-0.5b", "--gpu", gpu)
    assert code == 0, err
    topology = json.loads(out)["topology"]
    intra, inter = topology["intra_node"], topology["inter_node"]
    assert intra["allgather_ms_per_mib"] == pytest.approx(
        2**20 / (GPUS[gpu].cp_bus_bandwidth_gbs * 1e9) * 1e3, abs=1e-8
    )
    assert inter["allgather_ms_per_mib"] == inter["alltoall_ms_per_mib"] > 0
    assert topology["gpus_per_node"] == 8 and topology["source"]


def test_cluster_flags_describe_your_own_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--gpus-per-node", "4", "--intra-gbps", "150", "--inter-gbps", "22.5")
    code, out, err = run(capsys, "--model", "qwen2.5-0.5b", "--gpu", "a100-80g", *args)
    assert code == 0, err
    topology = profile_from_dict(json.loads(out)).topology
    assert topology is not None and topology.gpus_per_node == 4
    assert topology.intra_node.allgather_ms_per_mib == round(2**20 / 150e9 * 1e3, 8)
    assert topology.inter_node.alltoall_ms_per_mib == round(2**20 / 22.5e9 * 1e3, 8)
    assert topology.link_name([0, 1, 2, 3]) == "intra_node" and topology.link_name([2, 3, 4, 5]) == "inter_node"
    assert "(given)" in topology.source


@pytest.mark.parametrize(("flag", "value"), [("--gpus-per-node", "0"), ("--intra-gbps", "-3"), ("--inter-gbps", "0")])
def test_a_bad_cluster_figure_is_refused_naming_the_flag(
    capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    code, out, err = run(capsys, "--model", "qwen2.5-0.5b", flag, value)
    assert (code, out) == (2, "")
    assert flag in err and err.count("\n") == 1

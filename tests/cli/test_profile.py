"""``skrull profile``: one clear line without a GPU; the whole pipeline dry-run on the CPU; ``--check``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from skrull.solver.profile import profile_from_dict
from skrull.worker.profiling.check import check_block, check_what
from tests.cli.test_main import ROOT, skrull

NO_GPU = not torch.cuda.is_available()


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
def test_without_a_gpu_profile_says_it_needs_one_in_one_line() -> None:
    out = skrull("profile", "--model", "qwen2.5-0.5b")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("skrull: error: --device: 'cuda':")
    assert "measures a CUDA GPU and none is available" in out.stderr


def test_cpu_dry_run_writes_a_contract_profile_and_checks_it(tmp_path: Path) -> None:
    target = tmp_path / "tiny.json"
    out = skrull(
        "profile", "--device", "cpu", "--model", "tiny", "--max-tokens", "512", "--repeats", "5", "-o", str(target),
        "--progress",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    # the phases on stderr (tqdm), the summary line on stdout
    phases = out.stderr.replace("\r", "\n")
    assert "skrull profile: 100%" in phases and "4/4" in phases and "attention at 3 lengths" in phases
    assert out.stdout.startswith(f"wrote {target}")
    doc = json.loads(target.read_text())
    profile = profile_from_dict(doc)
    assert profile.compute.ms_per_tflop > 0 and profile.bucket_tokens > 0
    assert doc["estimated"] is False and doc["measured"]["device"].startswith("cpu")
    assert doc["measured"]["date"][:2] == "20" and doc["measured"]["kernel"] == "reference"
    assert [s["lengths"] for s in doc["compute"]["samples"]] == [[128], [256], [512], [64] * 4, [128] * 4]
    assert [s["tokens"] for s in doc["memory"]["samples"]] == [128, 256, 384, 512]
    assert [row["query_tokens"] for row in doc["attention"]["by_query_tokens"]] == [128, 256, 512]
    assert doc["comm"]["measured"] is False
    check = skrull(
        "profile", "--check", str(target), "--device", "cpu", "--dp", "1", "--cp", "2", "--per-rank", "3",
        "--bucket-tokens", "128", "--repeats", "1", "--dataset", "llama3-sft-mix", "--progress",
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
    assert "skrull profile --check: 100%" in check.stderr and "4/4" in check.stderr  # 2 planners x 2 ranks
    assert "| llama3-sft-mix | skrull |" in check.stdout and "| llama3-sft-mix | deepspeed |" in check.stdout
    assert "overall: median abs error" in check.stdout and "R^2" in check.stdout
    strict = skrull(
        "profile", "--check", str(target), "--device", "cpu", "--dp", "1", "--cp", "2", "--per-rank", "3",
        "--bucket-tokens", "128", "--repeats", "1", "--dataset", "llama3-sft-mix", "--solvers", "skrull",
        "--max-median-error", "1e-9",
    )  # fmt: skip
    assert strict.returncode == 1 and "overall: median abs error" in strict.stdout
    *progress, last = strict.stderr.strip().splitlines()  # piped: one line per rank measured, then the error
    assert last.startswith("skrull: error: check failed: median")
    assert progress == [
        "skrull profile --check: [1/2] llama3-sft-mix, skrull",
        "skrull profile --check: [2/2] llama3-sft-mix, skrull",
    ]

    before = json.loads(target.read_text())
    recorded = skrull(
        "profile", "--check", str(target), "--device", "cpu", "--dp", "1", "--cp", "2", "--per-rank", "3",
        "--bucket-tokens", "128", "--repeats", "1", "--dataset", "llama3-sft-mix", "--record",
    )  # fmt: skip
    assert recorded.returncode == 0, recorded.stderr
    after = json.loads(target.read_text())
    error = after["check"]["median_abs_rel_error"]
    assert f"overall: median abs error {error:.1%}" in recorded.stdout
    what = check_what(datasets=["llama3-sft-mix"], solvers=["skrull", "deepspeed"], dp=1, cp=2, sequences_per_rank=3)
    assert after == {**before, "check": check_block(median_abs_rel_error=error, limit=0.15, what=what)}


def test_a_calibrated_profile_is_checked_on_whole_microbatches(tmp_path: Path) -> None:
    from skrull.worker.profiling.document import _model_doc
    from skrull.worker.profiling.measure import TINY

    bare = json.loads((ROOT / "examples" / "requests" / "tiny-cpu-dp2-cp2.json").read_text())["profile"]
    doc = {**bare, "model": _model_doc(TINY), "microbatch_ms": 2.0, "calibrated": {"from": bare["name"]}}
    path = tmp_path / "calibrated.json"
    path.write_text(json.dumps(doc))
    args = (
        "profile", "--check", str(path), "--device", "cpu", "--dp", "1", "--cp", "2", "--per-rank", "3",
        "--bucket-tokens", "128", "--repeats", "1", "--dataset", "llama3-sft-mix", "--solvers", "skrull",
    )  # fmt: skip
    out = skrull(*args, "--record")
    assert out.returncode == 0, out.stderr
    assert "run whole (layers, head, backward; host time included)" in out.stdout
    assert "priced with microbatch_ms" in out.stdout and "overall: median abs error" in out.stdout
    recorded = json.loads(path.read_text())["check"]
    assert recorded["what"] == check_what(
        datasets=["llama3-sft-mix"], solvers=["skrull"], dp=1, cp=2, sequences_per_rank=3, measure="microbatches"
    )
    layers = skrull(*args, "--measure", "layers")  # asked for, the other measure
    assert layers.returncode == 0 and "every rank's compute of the first iteration" in layers.stdout


def test_check_refuses_a_profile_without_the_model_shape(tmp_path: Path) -> None:
    bare = json.loads((ROOT / "examples" / "requests" / "tiny-cpu-dp2-cp2.json").read_text())["profile"]
    path = tmp_path / "bare.json"
    path.write_text(json.dumps(bare))
    out = skrull("profile", "--check", str(path), "--device", "cpu")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "--check needs the model shape" in out.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "tpu"], "--device: 'tpu': must be cuda or cpu"),
        (["--device", "cpu", "--model", "gpt-9"], "--model: 'gpt-9': unknown model"),
        (["--device", "cpu", "--model", "tiny", "--max-tokens", "64"], "--max-tokens: 64: must be >= 128"),
        (["--device", "cpu", "--dtype", "float8"], "--dtype: 'float8': unknown"),
        (["--device", "cpu", "--max-median-error", "nan"], "--max-median-error: nan: must be a fraction > 0"),
    ],
)
def test_mistakes_end_with_one_line(args: list[str], message: str) -> None:
    out = skrull("profile", *args)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and message in out.stderr


@pytest.mark.gpu
@pytest.mark.skipif(NO_GPU, reason="needs a CUDA GPU")
def test_gpu_profile_of_a_small_model_fits_well(tmp_path: Path) -> None:
    target = tmp_path / "gpu.json"
    out = skrull("profile", "--model", "qwen2.5-0.5b", "--max-tokens", "4096", "-o", str(target))
    assert out.returncode == 0, out.stderr
    doc = json.loads(target.read_text())
    # Small packs of a small model are bound by the host launching eager kernels (a flat floor), so R^2
    # says little there; what planning needs is that the fit predicts each measured pack.
    assert doc["compute"]["median_abs_rel_error"] <= 0.15 and doc["memory"]["bucket_tokens"] > 4096


# --- skrull profile --links: the cluster's links, measured --------------------------------------------
def _base_with_topology(tmp_path: Path) -> Path:
    from skrull.solver.profile import load_profile

    doc = load_profile("h100-80g/qwen2.5-0.5b").to_dict()
    doc["topology"] = {
        "gpus_per_node": 8,
        "intra_node": {"allgather_ms_per_mib": 0.0027, "alltoall_ms_per_mib": 0.0031},
        "inter_node": {"allgather_ms_per_mib": 0.0208, "alltoall_ms_per_mib": 0.0227},
        "source": "published figures",
    }
    path = tmp_path / "base.json"
    path.write_text(json.dumps(doc))
    return path


def _torchrun(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    return subprocess.run(
        [str(ROOT / ".venv/bin/torchrun"), *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )


def test_links_without_two_processes_is_refused_in_one_line() -> None:
    out = skrull("profile", "--links", "--device", "cpu", "--gpus", "1")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--gpus: 1:" in out.stderr


def test_links_group_plan_is_intra_node_then_across_nodes() -> None:
    from skrull.worker.profiling.links import INTER_NODE, INTRA_NODE, link_groups

    assert link_groups(8, 8) == [(INTRA_NODE, (0, 1)), (INTRA_NODE, (0, 1, 2, 3)), (INTRA_NODE, tuple(range(8)))]
    two_nodes = link_groups(4, 2)
    assert two_nodes[0] == (INTRA_NODE, (0, 1))
    assert (INTER_NODE, (0, 2)) in two_nodes and (INTER_NODE, (0, 1, 2, 3)) in two_nodes
    for link, ranks in two_nodes:  # an inter-node group really spans nodes, an intra-node one does not
        assert (len({r // 2 for r in ranks}) > 1) == (link == INTER_NODE)


def test_links_fit_is_busbw_as_nccl_tests_defines_it() -> None:
    from skrull.worker.profiling.links import MIB, LinkSample, fit_link

    # 10 GB/s of bus bandwidth plus 0.05 ms latency, group of 4: t = (3/4 * B) / busbw + 0.05
    busbw = 10e9
    rows = [LinkSample(link="intra_node", collective="allgather", group_size=4, num_bytes=b,
                       ms=0.75 * b / busbw * 1e3 + 0.05) for b in (1 << 18, 1 << 20, 1 << 22)]  # fmt: skip
    ms_per_mib, fixed = fit_link(rows)
    assert ms_per_mib == pytest.approx(MIB / busbw * 1e3, rel=1e-6) and fixed == pytest.approx(0.05, rel=1e-6)


def test_links_under_torchrun_measures_the_node_and_keeps_the_starting_inter_node(tmp_path: Path) -> None:
    base = _base_with_topology(tmp_path)
    target = tmp_path / "links.json"
    out = _torchrun(
        "--standalone", "--nproc-per-node", "2", str(ROOT / ".venv/bin/skrull"), "profile", "--links",
        "--device", "cpu", "--repeats", "2", "--base", str(base), "-o", str(target),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(target.read_text())
    profile = profile_from_dict(doc)
    topo = doc["topology"]
    assert profile.topology is not None and profile.topology.gpus_per_node == 2
    assert topo["intra_node"]["allgather_ms_per_mib"] > 0.0027  # gloo on a shared CPU is no NVLink
    assert topo["inter_node"] == {"allgather_ms_per_mib": 0.0208, "alltoall_ms_per_mib": 0.0227}
    assert "inter_node: not measured" in topo["source"] and "kept from h100-80g/qwen2.5-0.5b" in topo["source"]
    assert "gloo" in topo["source"] and topo["measured"]["intra_node.allgather"][0]["group_size"] == 2
    assert doc["compute"] == json.loads(base.read_text())["compute"]  # the rest of the base is as it was


def test_links_across_two_simulated_nodes_measures_the_inter_node_link(tmp_path: Path) -> None:
    """Two torchrun invocations, --nnodes 2 on 127.0.0.1, one process each: the only group crosses nodes."""
    from skrull.worker.launch import free_port

    base = _base_with_topology(tmp_path)
    target = tmp_path / "links.json"
    port = str(free_port())
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", port]
    cmd = [str(ROOT / ".venv/bin/skrull"), "profile", "--links", "--device", "cpu", "--repeats", "2",
           "--base", str(base), "-o", str(target)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    second = subprocess.Popen(
        [str(ROOT / ".venv/bin/torchrun"), *common, "--node-rank", "1", *cmd],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    first = _torchrun(*common, "--node-rank", "0", *cmd)
    _, err = second.communicate(timeout=600)
    assert first.returncode == 0 and second.returncode == 0, (first.stderr[-2000:], err[-2000:])
    topo = json.loads(target.read_text())["topology"]
    assert topo["gpus_per_node"] == 1
    assert topo["inter_node"]["allgather_ms_per_mib"] > 0.0208 and topo["inter_node"]["alltoall_ms_per_mib"] > 0
    assert topo["intra_node"] == {"allgather_ms_per_mib": 0.0027, "alltoall_ms_per_mib": 0.0031}
    assert "inter_node: measured" in topo["source"] and "2 node(s) x 1" in topo["source"]

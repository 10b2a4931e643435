"""A mixture of experts' router auxiliary loss under plans: refused by default naming the option, and with
``router_aux_loss="per_microbatch"`` each microbatch's load-balancing loss over its own tokens (a CP group's
whole tokens where its sequences are sharded), equal to a single-process step that adds Hugging Face's own
``aux_loss`` over the same microbatches (worker/hf/router_loss.py)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from skrull.solver.errors import RequestError
from skrull.solver.plan import Iteration, Microbatch
from skrull.worker.hf.attention import refuse_unsupported_model
from skrull.worker.hf.model import build_model, read_model_config
from skrull.worker.hf.router_loss import RouterAux, check_router_aux_loss, router_microbatches
from skrull.worker.hf.step import refuse_untrained_model
from tests.launch import run_torchrun

ROOT = Path(__file__).resolve().parents[3]
MODELS = ROOT / "tests" / "conformance" / "models"
EXAMPLE = ROOT / "examples" / "torchrun_train.py"


def test_the_router_loss_is_refused_by_default_and_the_refusal_names_the_option() -> None:
    doc = read_model_config(MODELS / "qwen2-moe-router-aux.json", router_aux_loss="per_microbatch")
    with pytest.raises(RequestError, match=r'router_aux_loss="per_microbatch"'):
        read_model_config(MODELS / "qwen2-moe-router-aux.json")
    model = build_model(doc, seed=0, router_aux_loss="per_microbatch")
    with pytest.raises(ValueError, match=r'output_router_logits=True.*router_aux_loss="per_microbatch"'):
        refuse_untrained_model(model)
    refuse_untrained_model(model, router_aux_loss="per_microbatch")
    refuse_unsupported_model(model.config, router_aux_loss="per_microbatch")


@pytest.mark.parametrize("value", ["per-microbatch", "global", ""])
def test_an_unknown_router_aux_loss_is_refused_naming_it(value: str) -> None:
    with pytest.raises(ValueError, match=f"router_aux_loss={value!r}"):
        check_router_aux_loss(value)
    assert check_router_aux_loss(None) is None and check_router_aux_loss("per_microbatch") == "per_microbatch"


@pytest.mark.parametrize("name", ["qwen2-moe-router-aux", "mixtral-router-aux"])
def test_one_gpus_term_is_hugging_faces_aux_loss_times_its_coefficient_with_its_gradient(name: str) -> None:
    """A microbatch on one GPU: its term (value and router gradient) is the model's own ``coef * aux_loss``
    over the same packed tokens."""
    doc = read_model_config(MODELS / f"{name}.json", router_aux_loss="per_microbatch")
    model = build_model(doc, seed=1, attn_implementation="eager", router_aux_loss="per_microbatch")
    router = RouterAux.of(model.config)
    assert router is not None and router.num_experts == 4 and router.top_k == 2
    ids = torch.randint(0, 128, (1, 40), generator=torch.Generator().manual_seed(2))
    out = model(input_ids=ids, output_router_logits=True, use_cache=False)
    want = router.coef * out.aux_loss
    got = router.own_term(out.router_logits)
    assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-6)
    gates = [p for n, p in model.named_parameters() if n.endswith("mlp.gate.weight")]
    assert gates
    want_grads = torch.autograd.grad(want, gates, retain_graph=True)
    got_grads = torch.autograd.grad(got, gates)
    for w, g in zip(want_grads, got_grads, strict=True):
        assert float(w.abs().max()) > 0
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-9)


def test_a_config_without_router_logits_has_no_router_term() -> None:
    doc = read_model_config(MODELS / "qwen2-moe.json")
    assert RouterAux.of(build_model(doc, seed=0).config) is None


def test_the_microbatches_of_the_router_loss_are_a_groups_forward_or_each_gpus_own() -> None:
    def mb(
        step: int, ranks: tuple[int, ...], local: tuple[tuple[int, ...], ...], sharded: tuple[int, ...]
    ) -> Microbatch:
        return Microbatch(step=step, ranks=ranks, local=local, sharded=sharded, estimated_ms=1.0)

    iteration = Iteration(
        index=0,
        microbatches=(
            mb(0, (0, 1), ((0,), (1, 2)), (3,)),  # sharded over two GPUs: one forward of the group
            mb(0, (2, 3), ((4,), (5,)), ()),  # nothing sharded: each GPU's own forward
            mb(1, (2,), ((6, 7),), ()),
            mb(1, (3,), ((),), ()),  # an empty microbatch: no tokens, no term
        ),
        estimated_ms=1.0,
        lower_bound_ms=1.0,
    )
    assert router_microbatches(iteration) == [(0, 1, 2, 3), (4,), (5,), (6, 7)]


def _rows(path: Path, *, seed: int) -> Path:
    """Rows long enough that CP groups shard some of them in the first global batch."""
    rng = random.Random(seed)
    lines = [
        json.dumps({"input_ids": [rng.randrange(128) for _ in range(rng.choice([9, 30, 60, 100, 120]))]})
        for _ in range(16)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _example(tmp_path: Path, arch: str, dp: int, cp: int, sync: str, *extra: str) -> subprocess.CompletedProcess[str]:
    args = [
        "--model-config", str(MODELS / f"{arch}.json"), "--data", str(_rows(tmp_path / "rows.jsonl", seed=5)),
        "--dp", str(dp), "--cp", str(cp), "--bucket-tokens", str(128 // cp), "--global-batch-size", "8",
        "--steps", "1", "--grad-sync", sync, "--check", *extra,
    ]  # fmt: skip
    return run_torchrun(EXAMPLE, args, nproc=dp * cp, cwd=tmp_path, timeout_s=600)


@pytest.mark.parametrize(
    ("arch", "dp", "cp", "sync"),
    [("qwen2-moe-router-aux", 2, 2, "fsdp"), ("mixtral-router-aux", 1, 4, "ddp")],
)
def test_the_per_microbatch_router_loss_equals_the_plain_step_over_the_same_microbatches(
    tmp_path: Path, arch: str, dp: int, cp: int, sync: str
) -> None:
    """4 gloo processes, sequences sharded over CP groups in the first step (``cp modes: allgather``): the
    loss and every gradient equal the single-process sum of the cross-entropy and ``coef * aux`` of each of
    the plan's microbatches (found without the group's statistics: the router gate's gradient 0.21 off)."""
    done = _example(tmp_path, arch, dp, cp, sync, "--router-aux-loss", "per-microbatch")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "router aux loss: per_microbatch" in done.stdout  # the logged loss says which semantics
    assert "cp modes: allgather" in done.stdout  # sharded microbatches: the group's statistics were summed
    assert "check passed" in done.stdout, done.stdout


def test_without_the_option_every_rank_refuses_before_the_first_step_naming_it(tmp_path: Path) -> None:
    done = _example(tmp_path, "qwen2-moe-router-aux", 2, 2, "ddp")
    assert done.returncode != 0
    assert 'router_aux_loss="per_microbatch"' in done.stderr
    assert "losses:" not in done.stdout


TRAINER = ROOT / "examples" / "hf_trainer.py"
TRL = ROOT / "examples" / "trl_sft.py"


def _trainer_example(
    tmp_path: Path, integration: str, arch: str, dp: int, cp: int, *extra: str
) -> subprocess.CompletedProcess[str]:
    """The documented Trainer (``hf_trainer.py``) or TRL (``trl_sft.py``) script, one step, ``--check``."""
    if integration == "trainer":
        script, data = TRAINER, _rows(tmp_path / "rows.jsonl", seed=5)
    else:
        script, data = TRL, tmp_path / "chats.jsonl"
        write = [sys.executable, str(TRL), "--write-demo-data", "--data", str(data)]
        subprocess.run(write, check=True, cwd=tmp_path, capture_output=True)
    args = [
        "--model-config", str(MODELS / f"{arch}.json"), "--data", str(data), "--dp", str(dp), "--cp", str(cp),
        "--bucket-tokens", str(128 // cp), "--global-batch-size", "8", "--max-steps", "1",
        "--output-dir", str(tmp_path / "out"), "--check", *extra,
    ]  # fmt: skip
    return run_torchrun(script, args, nproc=dp * cp, cwd=tmp_path, timeout_s=600)


@pytest.mark.parametrize(
    ("integration", "arch", "dp", "cp"),
    [("trainer", "qwen2-moe-router-aux", 2, 2), ("trl", "mixtral-router-aux", 1, 4)],
)
def test_the_trainers_per_microbatch_router_loss_equals_the_own_loops_reference(
    tmp_path: Path, integration: str, arch: str, dp: int, cp: int
) -> None:
    """SkrullTrainer and SkrullSFTTrainer with ``router_aux_loss="per_microbatch"``: 4 gloo processes,
    sequences sharded over CP groups in the first step; the loss and every gradient equal the reference of
    the own loop's test (the plain step plus ``coef * aux`` of each of the plan's microbatches)."""
    done = _trainer_example(tmp_path, integration, arch, dp, cp, "--router-aux-loss", "per-microbatch")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "router aux loss: per_microbatch" in done.stdout  # the logged loss says which semantics
    assert "'router_aux_loss_per_microbatch'" in done.stdout  # and so does the Trainer's log line
    assert "cp modes: allgather" in done.stdout  # sharded microbatches: the group's statistics were summed
    assert "check passed" in done.stdout, done.stdout


def test_without_the_option_the_trainer_refuses_on_every_rank_naming_it(tmp_path: Path) -> None:
    done = _trainer_example(tmp_path, "trainer", "mixtral-router-aux", 2, 2)
    assert done.returncode != 0
    assert 'router_aux_loss="per_microbatch"' in done.stderr and "SkrullTrainer" in done.stderr
    assert "losses:" not in done.stdout

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
from typing import Any

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


ROWS = [{"input_ids": [(7 * n + t) % 128 for t in range(n)]} for n in (5, 9, 30, 60)]


def _trainer(tmp_path: Path, *, router_aux_loss: str | None, eval_dataset: object = None) -> Any:
    """A one-process ``SkrullTrainer`` over ``ROWS`` (one global batch of 4, several microbatches)."""
    from transformers import TrainingArguments

    from skrull.worker.dataloader import PlannedBatches
    from skrull.worker.hf.trainer import SkrullTrainer
    from skrull.worker.loader_options import LoaderOptions

    options = LoaderOptions(
        rank=0, dp=1, cp=1, global_batch_size=4, profile="h100-80g/qwen2.5-0.5b", bucket_tokens=64,
        equal_microbatches=True, prefetch=0, label_convention="hf",
    )  # fmt: skip
    rows = [{"input_ids": r["input_ids"], "labels": r["input_ids"]} for r in ROWS]
    planned = PlannedBatches(rows, [len(r["input_ids"]) for r in ROWS], options)
    doc = read_model_config(MODELS / "qwen2-moe-router-aux.json", router_aux_loss="per_microbatch")
    model = build_model(doc, seed=3, router_aux_loss="per_microbatch")
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[], max_steps=1, learning_rate=0.0,
        optim="sgd", max_grad_norm=0.0, logging_steps=1,
    )  # fmt: skip
    return SkrullTrainer(
        model=model, args=args, planned=planned, router_aux_loss=router_aux_loss, eval_dataset=eval_dataset
    )


def test_the_trainer_refuses_the_router_loss_by_default_and_evaluation_with_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r'output_router_logits=True.*router_aux_loss="per_microbatch".*SkrullTrainer'):
        _trainer(tmp_path, router_aux_loss=None)
    with pytest.raises(ValueError, match="router_aux_loss='per-microbatch'"):
        _trainer(tmp_path, router_aux_loss="per-microbatch")
    # the plain Trainer's eval_loss adds each eval batch's router loss, which evaluation under plans does not
    with pytest.raises(ValueError, match="eval_dataset with router_aux_loss='per_microbatch'"):
        _trainer(tmp_path, router_aux_loss="per_microbatch", eval_dataset=ROWS)


def test_one_trainer_step_is_the_plain_step_plus_each_planned_microbatchs_router_loss(tmp_path: Path) -> None:
    """One process, several microbatches: the step's loss, its logged router part and every gradient equal
    the reference the own loop is checked against."""
    from skrull.worker.hf.step import model_gradients, plain_step, step_errors

    trainer = _trainer(tmp_path, router_aux_loss="per_microbatch")
    grads: dict[str, torch.Tensor] = {}
    original = trainer.training_step

    def step(*a: Any, **kw: Any) -> torch.Tensor:
        out = original(*a, **kw)
        grads.update({n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None})
        return out

    trainer.training_step = step
    trainer.train()
    units = router_microbatches(trainer.planned.plan_of(0).iterations[0])
    assert len(units) >= 2  # the router term summed over several microbatches
    doc = read_model_config(MODELS / "qwen2-moe-router-aux.json", router_aux_loss="per_microbatch")
    reference = build_model(doc, seed=3, attn_implementation="eager", router_aux_loss="per_microbatch")
    batch = trainer.planned.batches[0]
    want = plain_step(reference, [torch.tensor(ROWS[i]["input_ids"]) for i in batch], router_microbatches=units)
    errors = step_errors(
        loss=trainer.step_losses[0], reference_loss=want, grads=grads, reference_grads=model_gradients(reference)
    )
    assert max(errors.values()) <= 1e-4, errors
    router_part = trainer.step_router_losses[0]
    assert 0 < router_part < trainer.step_losses[0]
    logged = [e for e in trainer.state.log_history if "loss" in e]
    assert logged[0]["router_aux_loss_per_microbatch"] == pytest.approx(router_part)

"""Hugging Face Qwen2 and Llama trained under plans on 4 gloo processes equal the plain HF step.

One launch runs every case in the same 4 processes (transformers is imported once per process): plans
with sharded sequences next to local ones, idle ranks, groups wider than CP, a group member holding no
token of its microbatch, both CP schemes and the chunked loss. Each case's loss and every parameter
gradient of every step must be within 1e-4 relative of the plain single-process step over the same
global batch (padded, eager attention, no packing, no CP).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from skrull.solver.io import request_from_dict
from skrull.solver.planners.base import PlannerOutput
from skrull.solver.planning import assemble_plan, solve
from skrull.solver.types import MicrobatchSpec, Plan, Problem
from skrull.solver.validate import validate_plan
from skrull.worker.hf.finetune import FinetuneConfig, check_steps, result_from_parts, run_finetune_rank
from skrull.worker.launch import launch
from skrull.worker.layout import rank_layouts
from tests.conftest import HAND_PROFILE, make_request
from tests.worker.modes import run_in

ROOT = Path(__file__).resolve().parents[3]
MODELS = ROOT / "examples" / "models"
WORLD = 4
TOLERANCE = 1e-4


def model_config(name: str) -> dict[str, Any]:
    path = MODELS / f"{name}.json"
    if not path.exists():  # the conformance matrix's families (Gemma 2 with its softcaps)
        path = ROOT / "tests" / "conformance" / "models" / f"{name}.json"
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def skrull_plan() -> tuple[Plan, tuple[int, ...]]:
    """DP2 x CP2, bucket 64: the 100- and 120-token sequences are sharded, some ranks idle in a step."""
    request = make_request(
        [[40, 5, 100, 3, 17, 120, 9, 33, 64, 2, 77, 25], [90, 12, 50, 7, 30, 6]], dp=2, cp=2, bucket=64
    )
    return solve(request), Problem.from_request(request).lengths


def wide_plan() -> tuple[Plan, tuple[int, ...]]:
    """dynamic-cp shards the 120- and 100-token sequences over all 4 GPUs (groups wider than CP = 2)."""
    request = make_request([[120, 9, 100, 5, 30, 2, 60, 17]], dp=2, cp=2, bucket=64, solver="dynamic-cp")
    return solve(request), Problem.from_request(request).lengths


def hand_plan() -> tuple[Plan, tuple[int, ...]]:
    """A 3-token sequence sharded over 4 GPUs (position 3 holds none of it) next to local sequences, then
    a 70-token sequence over one CP pair while GPU 3 idles beside a local sequence on GPU 2."""
    request = make_request([[3, 70, 20, 9, 50]], dp=2, cp=2, bucket=64, solver="skrull")
    problem = Problem.from_request(request)
    specs = (
        MicrobatchSpec(step=0, ranks=(0, 1, 2, 3), local=((2,), (), (3,), ()), sharded=(0,)),
        MicrobatchSpec(step=1, ranks=(0, 1), local=((), ()), sharded=(1,)),
        MicrobatchSpec(step=1, ranks=(2, 3), local=((4,), ()), sharded=()),
    )
    plan = assemble_plan(problem, PlannerOutput(iterations=(specs,)), solver="skrull", wall_ms=0.0)
    validate_plan(plan, request)
    return plan, problem.lengths


def mixed_plan() -> tuple[Plan, tuple[int, ...]]:
    """``hand_plan``'s placement with both modes in one iteration: the 3-token sequence over 4 GPUs in
    Ulysses (2 K/V heads, so each goes out twice), the 70-token one over a CP pair with the all-gather."""
    return _mixed(
        MicrobatchSpec(step=0, ranks=(0, 1, 2, 3), local=((2,), (), (3,), ()), sharded=(0,), mode="ulysses"),
        MicrobatchSpec(step=1, ranks=(0, 1), local=((), ()), sharded=(1,), mode="allgather"),
        MicrobatchSpec(step=1, ranks=(2, 3), local=((4,), ()), sharded=()),
    )


def _mixed(*specs: MicrobatchSpec) -> tuple[Plan, tuple[int, ...]]:
    """``specs`` over ``hand_plan``'s batch on DP2 x CP2 (8 heads, 2 K/V), both modes allowed, validated."""
    request = request_from_dict(
        {
            "batches": [[3, 70, 20, 9, 50]], "parallel": {"dp": 2, "cp": 2}, "solver": "skrull",
            "profile": {**HAND_PROFILE, "memory": {"bucket_tokens": 64}, "heads": {"attention": 8, "kv": 2},
                        "comm_a2a": {"bytes_per_token": 2**20, "ms_per_mib": 0.0004, "fixed_ms": 0.3}},
            "cp_modes": ["allgather", "ulysses"],
        }
    )  # fmt: skip
    problem = Problem.from_request(request)
    plan = assemble_plan(problem, PlannerOutput(iterations=(tuple(specs),)), solver="skrull", wall_ms=0.0)
    validate_plan(plan, request)
    assert {mb.mode for mb in plan.iterations[0].microbatches if mb.sharded} == {"allgather", "ulysses"}
    return plan, problem.lengths


def mixed_long_plan() -> tuple[Plan, tuple[int, ...]]:
    """Both modes on sequences longer than the conformance models' sliding window (24): the 70-token
    sequence in Ulysses over 4 GPUs next to local ones, then the 50-token one with the all-gather over a CP
    pair, so Gemma 2's soft-capping and windows and Mistral's window run in both modes in one iteration."""
    return _mixed(
        MicrobatchSpec(step=0, ranks=(0, 1, 2, 3), local=((2,), (), (3,), ()), sharded=(1,), mode="ulysses"),
        MicrobatchSpec(step=1, ranks=(0, 1), local=((), ()), sharded=(4,), mode="allgather"),
        MicrobatchSpec(step=1, ranks=(2, 3), local=((0,), ()), sharded=()),
    )


PLANS = {
    "skrull": skrull_plan,
    "wide": wide_plan,
    "hand": hand_plan,
    "mixed": mixed_plan,
    "mixed-long": mixed_long_plan,
}
#: (case name, plan, model, steps, the mode its sharded microbatches run in (``tests.worker.modes.run_in``:
#: ``ulysses`` marks them all so, ``allgather`` runs the plan as planned), loss chunk rows, gradient sync)
CASES: tuple[tuple[str, str, str, int, str, int | None, str], ...] = (
    ("qwen2-skrull", "skrull", "qwen2-tiny", 2, "allgather", None, "allreduce"),
    ("llama-skrull", "skrull", "llama-tiny", 1, "allgather", None, "allreduce"),
    ("qwen2-wide", "wide", "qwen2-tiny", 1, "allgather", None, "allreduce"),
    ("llama-wide-ulysses", "wide", "llama-tiny", 1, "ulysses", None, "allreduce"),
    ("qwen2-hand-ulysses", "hand", "qwen2-tiny", 1, "ulysses", 16, "allreduce"),
    ("llama-hand", "hand", "llama-tiny", 2, "allgather", None, "allreduce"),
    # both modes in one iteration: each microbatch runs its plan's
    ("llama-mixed", "mixed", "llama-tiny", 1, "allgather", None, "allreduce"),
    ("qwen2-mixed", "mixed", "qwen2-tiny", 1, "ulysses", None, "allreduce"),
    # and over the other families' attention: Gemma 2's soft-capping and sliding window, Mistral's window,
    # Llama with one K/V head (sent four times over the Ulysses group)
    ("gemma2-mixed-long", "mixed-long", "gemma2-softcap", 1, "allgather", None, "allreduce"),
    ("mistral-mixed-long", "mixed-long", "mistral-window", 1, "ulysses", None, "allreduce"),
    ("llama-1kv-mixed-long", "mixed-long", "llama-1kv-tied", 1, "allgather", None, "allreduce"),
    # the chunked loss through the DDP and FSDP2 wrappers (their hooks run; FSDP2 unshards the root's head),
    # and with Gemma 2's final logit softcap, which the chunked loss takes as the model does
    ("llama-hand-fsdp-chunked", "hand", "llama-tiny", 1, "allgather", 16, "fsdp"),
    ("qwen2-hand-ddp-chunked", "hand", "qwen2-tiny", 1, "allgather", 16, "ddp"),
    ("gemma2-skrull-chunked", "skrull", "gemma2-softcap", 1, "allgather", 16, "allreduce"),
)


def config_of(model: str, steps: int, chunk: int | None, grad_sync: str = "allreduce") -> FinetuneConfig:
    return FinetuneConfig(
        model_config=model_config(model),
        steps=steps,
        seed=11,
        lr=0.1,
        record_grads=True,
        loss_chunk_tokens=chunk,
        grad_sync=grad_sync,
    )


def run_cases(rank: int, world_size: int, backend: str, out_dir: str) -> None:
    for name, plan_name, model, steps, cp_mode, chunk, grad_sync in CASES:
        plan, lengths = PLANS[plan_name]()
        run = config_of(model, steps, chunk, grad_sync)
        part = run_finetune_rank(run_in(plan, cp_mode), lengths, config=run, rank=rank, device=torch.device("cpu"))
        torch.save(part, Path(out_dir) / f"{name}-rank{rank}.pt")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hf-finetune")
    launch(run_cases, world_size=WORLD, args=(str(out),))
    return out


def test_the_plans_exercise_sharding_idle_ranks_wide_groups_and_empty_members() -> None:
    plan, _ = skrull_plan()
    mbs = [mb for it in plan.iterations for mb in it.microbatches]
    assert any(mb.sharded and any(mb.local) for mb in mbs)
    assert any(not mb.sharded and not all(mb.local) for mb in mbs)  # a rank with nothing in a step
    wide, _ = wide_plan()
    assert any(mb.sharded and len(mb.ranks) > 2 for it in wide.iterations for mb in it.microbatches)
    hand, hand_lengths = hand_plan()
    (first, *_) = rank_layouts(hand, hand_lengths, iteration=0, rank=3)
    assert first.communicates and first.num_tokens == 0  # in the group, holding none of its tokens


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_loss_and_every_gradient_equal_the_plain_hf_step(
    runs: Path, case: tuple[str, str, str, int, str, int | None, str]
) -> None:
    name, plan_name, model, steps, cp_mode, chunk, grad_sync = case
    plan, lengths = PLANS[plan_name]()
    parts = [torch.load(runs / f"{name}-rank{r}.pt", weights_only=False) for r in range(WORLD)]
    result = result_from_parts(parts)
    assert [r.step for r in result.steps] == list(range(steps))
    # every token of every step's global batch was computed once: the ranks' tokens add up
    per_step = sum(lengths[i] for s in range(steps) for i in _seq_ids(plan, s))
    assert sum(tokens for _, tokens in result.work) == per_step
    checks = check_steps(run_in(plan, cp_mode), lengths, result, config=config_of(model, steps, chunk, grad_sync))
    assert len(checks) == steps
    for c in checks:
        assert c.grads_checked == len(parts[0]["records"][0].grads)
        assert c.loss_rel_error <= TOLERANCE, (name, c)
        assert c.worst_grad[1] <= TOLERANCE, (name, c)
    # the targets are every token but each sequence's last: HF's shifted loss counts the same
    for r in result.steps:
        assert r.num_targets == sum(lengths[i] - 1 for i in _seq_ids(plan, r.step))


def _seq_ids(plan: Plan, step: int) -> list[int]:
    it = plan.iterations[step % len(plan.iterations)]
    return [i for mb in it.microbatches for i in mb.seq_ids]


def test_the_check_sees_gradients_off_by_one_percent() -> None:
    """The check is not blind: gradients 1% too large (a wrong normalizer would do that) show as 1e-2."""
    plan, lengths = hand_plan()
    config = config_of("llama-tiny", 1, "allgather", None)
    from skrull.worker.hf.finetune import FinetuneResult, StepRecord
    from skrull.worker.hf.model import build_model
    from skrull.worker.hf.step import plain_step
    from skrull.worker.inputs import SyntheticData

    model = build_model(config.model_config, seed=config.seed, attn_implementation="eager")
    data = SyntheticData(seed=config.seed, lengths=lengths)
    loss = plain_step(model, [data.lm_tokens(i, 128)[0] for i in _seq_ids(plan, 0)])
    grads = {n: p.grad.clone() * 1.01 for n, p in model.named_parameters() if p.grad is not None}
    fake = FinetuneResult(
        steps=(StepRecord(step=0, iteration=0, loss=loss, num_targets=1, seconds=0.0, grads=grads),),
        kernel="reference",
        work=(),
    )
    (check,) = check_steps(plan, lengths, fake, config=config)
    assert check.loss_rel_error <= 1e-6
    assert check.worst_grad[1] == pytest.approx(0.01, rel=1e-3)

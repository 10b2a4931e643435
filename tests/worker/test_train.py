"""A tiny causal transformer trained one step under a skrull plan equals the unscheduled step.

Two decoder layers, random weights; 4 gloo processes run the plan's microbatches (DACP attention over
each group, per-token loss over the iteration, gradients summed over the world, one SGD step); one
process runs every sequence alone in loader order. Loss, gradients and updated weights must agree.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from skrull.solver.planning import solve
from skrull.solver.types import Plan, Problem
from skrull.worker.collectives import GroupRegistry
from skrull.worker.inputs import SyntheticData
from skrull.worker.kernels import select_kernel
from skrull.worker.launch import launch
from skrull.worker.loss import count_supervised_tokens, per_token_loss
from skrull.worker.model import TinyCausalLM
from skrull.worker.train import scheduled_backward, unscheduled_backward
from tests.conftest import make_request
from tests.worker.modes import run_in

WORLD = 4
LR = 0.5
MODES = ("allgather", "ulysses")


def tiny_model(seed: int = 3) -> TinyCausalLM:
    torch.manual_seed(seed)
    return TinyCausalLM(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)


def skrull_plan() -> tuple[Plan, SyntheticData]:
    request = make_request(
        [[40, 5, 100, 3, 17, 120, 9, 33, 64, 2, 77, 25], [90, 12, 50, 7, 30, 6]], dp=2, cp=2, bucket=64
    )
    plan = solve(request)
    return plan, SyntheticData(seed=5, lengths=Problem.from_request(request).lengths)


def train_ranks(rank: int, world_size: int, backend: str, out_dir: str) -> None:
    plan, data = skrull_plan()
    device = torch.device("cpu")
    registry = GroupRegistry.for_plan(plan)
    kernel = select_kernel(device, torch.float32)
    for mode in MODES:
        for iteration in range(len(plan.iterations)):
            model = tiny_model()
            loss = scheduled_backward(
                model, run_in(plan, mode), data, iteration=iteration, rank=rank, registry=registry, kernel=kernel,
                device=device,
            )  # fmt: skip
            grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
            torch.optim.SGD(model.parameters(), lr=LR).step()
            if rank == 0:
                torch.save(
                    {"loss": loss, "grads": grads, "params": model.state_dict()},
                    Path(out_dir) / f"{mode}-it{iteration}.pt",
                )


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("train")
    launch(train_ranks, world_size=WORLD, args=(str(out),))
    return out


@pytest.mark.parametrize("mode", MODES)
def test_one_step_under_the_plan_equals_the_unscheduled_step(trained: Path, mode: str) -> None:
    plan, data = skrull_plan()
    mixed = [mb for it in plan.iterations for mb in it.microbatches if mb.sharded and any(mb.local)]
    assert mixed, "the plan must exercise rollback (local and sharded sequences in one microbatch)"
    for iteration, it in enumerate(plan.iterations):
        got = torch.load(trained / f"{mode}-it{iteration}.pt", weights_only=False)
        model = tiny_model()
        seq_ids = sorted(i for mb in it.microbatches for i in mb.seq_ids)
        loss = unscheduled_backward(model, data, seq_ids)
        assert got["loss"] == pytest.approx(loss, rel=1e-5)
        for name, param in model.named_parameters():
            assert param.grad is not None
            assert torch.allclose(got["grads"][name], param.grad, rtol=1e-4, atol=1e-6), name
        torch.optim.SGD(model.parameters(), lr=LR).step()
        for name, value in model.state_dict().items():
            assert torch.allclose(got["params"][name], value, rtol=1e-4, atol=1e-6), name


def test_per_token_loss_is_independent_of_how_tokens_are_split() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(30, 11, generator=gen)
    labels = torch.randint(0, 11, (30,), generator=gen)
    labels[[3, 17]] = -100
    whole = torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100)
    supervised = int((labels != -100).sum())
    parts = [(0, 4), (4, 19), (19, 30)]
    summed = sum(per_token_loss(logits[a:b], labels[a:b], num_tokens_in_iteration=supervised) for a, b in parts)
    assert float(summed) == pytest.approx(float(whole), rel=1e-6)
    # averaging per microbatch instead (the usual gradient-accumulation loss) depends on the split
    per_mb = sum(
        torch.nn.functional.cross_entropy(logits[a:b], labels[a:b], ignore_index=-100) for a, b in parts
    ) / len(parts)
    assert abs(float(per_mb) - float(whole)) > 1e-3
    assert count_supervised_tokens([labels[:4], labels[4:]]) == supervised
    with pytest.raises(ValueError, match="num_tokens_in_iteration"):
        per_token_loss(logits, labels, num_tokens_in_iteration=0)

"""The fast step (decoder layers compiled with inductor, worker/compiling.py) on 2 gloo processes:
loss and every gradient equal the eager step's within float32 tolerance on planned microbatches with
shard pieces (both CP schemes), equal the plain Hugging Face step, and nothing recompiles after the
warm-up step although every step brings other token counts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from skrull.solver.planning import solve
from skrull.solver.types import Plan, Problem
from skrull.worker.hf.finetune import FinetuneConfig, check_steps, result_from_parts, run_finetune_rank
from skrull.worker.launch import launch
from skrull.worker.layout import rank_layouts
from tests.conftest import make_request
from tests.worker.hf.test_finetune import model_config
from tests.worker.modes import run_in

WORLD = 2
#: compiled vs eager: the same float32 arithmetic up to inductor's fusion and reordering
TOLERANCE_VS_EAGER = 1e-5
TOLERANCE_VS_PLAIN = 1e-4
#: (name, compile, the mode the plan's sharded microbatches run in: ``tests.worker.modes.run_in``)
CASES = (("eager", "off", "allgather"), ("compiled", "on", "allgather"), ("compiled-ulysses", "on", "ulysses"))


def sharded_plan() -> tuple[Plan, tuple[int, ...]]:
    """DP1 x CP2, bucket 48: the 70-, 80- and 90-token sequences are sharded; 3 iterations."""
    request = make_request([[70, 20, 9, 41], [45, 33, 80, 12], [66, 7, 25, 90]], dp=1, cp=2, bucket=48)
    return solve(request), Problem.from_request(request).lengths


def config(compile: str) -> FinetuneConfig:
    return FinetuneConfig(
        model_config=model_config("qwen2-tiny"),
        steps=3,
        warmup_steps=1,
        seed=5,
        lr=0.1,
        record_grads=True,
        loss_chunk_tokens=16,
        compile=compile,
    )


def run_cases(rank: int, world_size: int, backend: str, out_dir: str) -> None:
    plan, lengths = sharded_plan()
    for name, compile, cp_mode in CASES:
        part = run_finetune_rank(
            run_in(plan, cp_mode), lengths, config=config(compile), rank=rank, device=torch.device("cpu")
        )
        torch.save(part, Path(out_dir) / f"{name}-rank{rank}.pt")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fast-step")
    launch(run_cases, world_size=WORLD, args=(str(out),))
    return out


def test_the_plan_shards_and_brings_new_token_counts_every_step() -> None:
    plan, lengths = sharded_plan()
    assert all(any(mb.sharded for mb in it.microbatches) for it in plan.iterations)
    counts = [
        {lay.num_tokens for lay in rank_layouts(plan, lengths, iteration=i, rank=0)}
        for i in range(len(plan.iterations))
    ]
    assert counts[1] - counts[0] and counts[2] - counts[0] - counts[1]  # token counts the warm-up never saw


@pytest.mark.parametrize("name", ["compiled", "compiled-ulysses"])
def test_the_compiled_step_equals_the_eager_step_and_the_plain_step(runs: Path, name: str) -> None:
    eager = result_from_parts([torch.load(runs / f"eager-rank{r}.pt", weights_only=False) for r in range(WORLD)])
    fast = result_from_parts([torch.load(runs / f"{name}-rank{r}.pt", weights_only=False) for r in range(WORLD)])
    assert fast.compiled and not eager.compiled
    assert fast.kernel_line.startswith("attention kernel: reference")
    for a, b in zip(eager.steps, fast.steps, strict=True):
        assert abs(a.loss - b.loss) <= TOLERANCE_VS_EAGER * abs(a.loss)
        for param, want in a.grads.items():
            err = float((b.grads[param] - want).abs().max()) / float(want.abs().max())
            assert err <= TOLERANCE_VS_EAGER, (param, err)
    plan, lengths = sharded_plan()
    for check in check_steps(plan, lengths, fast, config=config("on")):
        assert check.max_rel_error <= TOLERANCE_VS_PLAIN, check


def test_nothing_recompiles_after_the_warm_up_step(runs: Path) -> None:
    fast = result_from_parts([torch.load(runs / f"compiled-rank{r}.pt", weights_only=False) for r in range(WORLD)])
    assert [r.compiles for r in fast.steps] == [0, 0, 0]

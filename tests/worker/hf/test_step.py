"""What the chunked loss must do after the LM head, read from the model's config: Gemma 2's final softcap is
taken, a logit scale is refused naming the field (a chunked loss without it would train a wrong gradient)."""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

import pytest

from skrull.worker.hf.step import fused_head_softcap


def test_the_final_logit_softcap_is_read_and_none_means_none() -> None:
    assert fused_head_softcap(SimpleNamespace(final_logit_softcapping=30.0)) == 30.0
    assert fused_head_softcap(SimpleNamespace(final_logit_softcapping=None)) is None
    assert fused_head_softcap(SimpleNamespace()) is None


@pytest.mark.parametrize(("field", "value"), [("logit_scale", 0.0625), ("logits_scaling", 8.0)])
def test_a_logit_scale_is_refused_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"loss_chunk_tokens: the model's {field}={value!r} scales its logits"):
        fused_head_softcap(SimpleNamespace(**{field: value}))
    assert fused_head_softcap(SimpleNamespace(**{field: 1.0})) is None  # a scale of one changes nothing


def test_a_ulysses_microbatch_over_a_group_not_dividing_the_models_heads_is_refused_before_any_forward() -> None:
    # the tiny Qwen2 has 4 attention heads; a plan made with another model's profile may run Ulysses over 3
    # GPUs: refused naming the microbatch and the heads before the step's first forward (no gradient yet)
    from pathlib import Path

    import torch

    from skrull.worker.dataloader import ready_microbatch
    from skrull.worker.hf.model import build_model, read_model_config
    from skrull.worker.hf.step import model_heads, scheduled_step
    from skrull.worker.kernels import select_kernel
    from skrull.worker.layout import MicrobatchLayout, ShardedSequence

    config = Path(__file__).resolve().parents[3] / "examples" / "models" / "qwen2-tiny.json"
    model = build_model(read_model_config(str(config)), seed=0)
    assert model_heads(model) == (4, 2)
    cpu = torch.device("cpu")

    def fetch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.arange(9) + i
        return ids, ids

    local = MicrobatchLayout(step=0, ranks=(0,), position=0, local_ids=(1,), local_lengths=(9,), sharded=())
    pieces = (((0, 3),), ((3, 6),), ((6, 9),))

    def sharded(size: int, mode: str) -> MicrobatchLayout:
        ranges = pieces if size == 3 else (((0, 5),), ((5, 9),))
        return MicrobatchLayout(
            step=1, ranks=tuple(range(size)), position=0, local_ids=(), local_lengths=(),
            sharded=(ShardedSequence(seq_id=0, num_tokens=9, ranges=ranges),), mode=mode,
        )  # fmt: skip

    def step(*layouts: MicrobatchLayout) -> None:
        mbs = [ready_microbatch(lay, fetch, loss_normalizer=18, device=cpu) for lay in layouts]
        kernel = select_kernel(cpu, torch.float32)
        scheduled_step(model, mbs, registry=None, kernel=kernel, device=cpu)  # type: ignore[arg-type]

    with pytest.raises(ValueError, match=r"microbatch 1 runs ulysses over 3 GPUs.*num_attention_heads = 4"):
        step(local, sharded(3, "ulysses"))
    assert all(p.grad is None for p in model.parameters())  # refused before the first microbatch ran
    # the plan's mode is what runs: no run-level setting turns an all-gather microbatch into Ulysses
    assert "cp_mode" not in inspect.signature(scheduled_step).parameters


def test_a_model_with_other_heads_than_the_plans_is_refused_by_the_step_on_every_rank_alike(tmp_path: Any) -> None:
    # a loop that never called ``check_model_heads``: each microbatch says which heads its plan was made for,
    # so every rank refuses before its first forward, even one whose own microbatches shard nothing (it would
    # otherwise wait in the step's collectives for a rank whose Ulysses microbatch failed)
    from pathlib import Path

    import torch
    import torch.distributed as dist

    from skrull.solver.errors import RequestError
    from skrull.worker.dataloader import ready_microbatch
    from skrull.worker.hf.model import build_model, read_model_config
    from skrull.worker.hf.step import scheduled_step
    from skrull.worker.kernels import select_kernel
    from skrull.worker.layout import MicrobatchLayout

    config = Path(__file__).resolve().parents[3] / "examples" / "models" / "qwen2-tiny.json"
    model = build_model(read_model_config(str(config)), seed=0)  # 4 attention heads, 2 K/V
    cpu = torch.device("cpu")
    local = MicrobatchLayout(step=0, ranks=(0,), position=0, local_ids=(1,), local_lengths=(9,), sharded=())

    def step(plan_heads: tuple[int, int] | None) -> None:
        def fetch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.arange(9) + i, torch.arange(9) + i

        mb = ready_microbatch(local, fetch, loss_normalizer=9, device=cpu, plan_heads=plan_heads)
        kernel = select_kernel(cpu, torch.float32)
        scheduled_step(model, [mb], registry=None, kernel=kernel, device=cpu)  # type: ignore[arg-type]

    with pytest.raises(RequestError) as refused:
        step((8, 8))
    assert refused.value.field == "profile.heads" and "num_attention_heads = 4" in str(refused.value)
    assert all(p.grad is None for p in model.parameters())
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        step((4, 2))  # the plan's heads are the model's: runs (a world of one for its gradient sums)
    finally:
        dist.destroy_process_group()
    assert any(p.grad is not None for p in model.parameters())


def _idle_rank_worker(rank: int, store: str, out: str) -> None:
    """Rank 0 runs a microbatch planned for other heads than the model's; rank 1 has none this step."""
    import json
    from pathlib import Path

    import torch
    import torch.distributed as dist

    from skrull.worker.dataloader import ready_microbatch
    from skrull.worker.hf.model import build_model, read_model_config
    from skrull.worker.hf.step import scheduled_step
    from skrull.worker.kernels import select_kernel
    from skrull.worker.layout import MicrobatchLayout

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        config = Path(__file__).resolve().parents[3] / "examples" / "models" / "qwen2-tiny.json"
        model = build_model(read_model_config(str(config)), seed=0)
        cpu = torch.device("cpu")
        local = MicrobatchLayout(step=0, ranks=(0,), position=0, local_ids=(1,), local_lengths=(9,), sharded=())
        mbs = []
        if rank == 0:
            ids = torch.arange(9)
            mbs = [ready_microbatch(local, lambda i: (ids, ids), loss_normalizer=9, device=cpu, plan_heads=(8, 8))]
        try:
            scheduled_step(model, mbs, registry=None, kernel=select_kernel(cpu, torch.float32), device=cpu)  # type: ignore[arg-type]
            outcome = "ran"
        except ValueError as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        grads = any(p.grad is not None for p in model.parameters())
        Path(out, f"rank{rank}.json").write_text(json.dumps({"outcome": outcome, "grads": grads}))
    finally:
        dist.destroy_process_group()


def test_an_idle_rank_stops_with_the_rank_that_refuses_instead_of_waiting_in_a_collective(tmp_path: Any) -> None:
    # two gloo processes: rank 0 refuses (its plan was made for 8 heads, the model has 4), rank 1 has no
    # microbatch this step and would otherwise wait for rank 0 in the step's all-reduce for ever
    import json

    import torch.multiprocessing as mp

    mp.spawn(_idle_rank_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True, daemon=True)
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert got[0]["outcome"].startswith("RequestError") and "profile.heads" in got[0]["outcome"]
    assert got[1]["outcome"].startswith("ValueError") and "1 other rank(s) refused this step" in got[1]["outcome"]
    assert not got[0]["grads"] and not got[1]["grads"]


def test_a_plan_with_ulysses_over_a_group_not_dividing_the_models_heads_is_refused_whole_on_every_rank() -> None:
    # skrull finetune holds the whole plan: every rank refuses it before the first step (a rank outside the
    # Ulysses group would otherwise go on into the step's collectives and wait for the ranks that stopped)
    from types import SimpleNamespace

    from skrull.worker.hf.step import refuse_unrunnable_plan
    from tests.worker.hf.test_finetune import hand_plan, mixed_plan
    from tests.worker.modes import all_ulysses

    plan, _ = mixed_plan()  # Ulysses over 4 GPUs, all-gather over 2
    six = SimpleNamespace(config=SimpleNamespace(num_attention_heads=6, num_key_value_heads=2))
    with pytest.raises(ValueError, match=r"iteration 0 microbatch \d runs ulysses over 4 GPUs.*heads = 6"):
        refuse_unrunnable_plan(six, plan)
    five = SimpleNamespace(config=SimpleNamespace(num_attention_heads=5))
    allgather_plan, _ = hand_plan()  # every microbatch all-gather: runs as planned whatever the heads
    refuse_unrunnable_plan(five, allgather_plan)
    with pytest.raises(ValueError, match=r"iteration 0 microbatch \d runs ulysses over \d GPUs.*heads = 5"):
        refuse_unrunnable_plan(five, all_ulysses(allgather_plan))  # planned with cp_modes ["ulysses"]
    eight = SimpleNamespace(config=SimpleNamespace(num_attention_heads=8, num_key_value_heads=2))
    refuse_unrunnable_plan(eight, all_ulysses(plan))  # 4 and 2 divide 8: runs

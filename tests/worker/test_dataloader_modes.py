"""PlannedBatches with ``cp_modes``: the requests carry them, a profile that cannot price Ulysses or a bad
mode is refused before the first step naming the field, resuming with other modes is refused, and
``plan_of`` / ``sharding_modes`` say what each iteration's plan runs. Plans in process (``LocalPlans``)."""

from __future__ import annotations

from typing import Any

import pytest

from skrull.solver.errors import RequestError
from skrull.worker.dataloader import PlannedBatches
from skrull.worker.loader_options import LoaderOptions
from skrull.worker.plan_sources import LocalPlans
from tests.examples.mixed_modes import mixed_profile


def make_loader(plans: LocalPlans, **kw: Any) -> PlannedBatches:
    lengths = [3, 70, 250, 9, 17, 30, 5, 70, 250, 3, 9, 17, 30, 5, 70, 250] * 2
    options: dict[str, Any] = {
        "rank": 0, "dp": 1, "cp": 4, "global_batch_size": 16, "bucket_tokens": 64, "seed": 0,
        "profile": mixed_profile(), "time_budget_s": 0.2,
    }  # fmt: skip
    options.update(kw)
    return PlannedBatches([[1] * n for n in lengths], lengths, LoaderOptions(**options), plans=plans)


def test_the_requests_carry_the_modes_and_the_plans_mix_them() -> None:
    plans = LocalPlans()
    loader = make_loader(plans, cp_modes=["ulysses", "allgather"])
    assert loader.request_document(0)["cp_modes"] == ["allgather", "ulysses"]  # one order, as the planner's
    assert loader.sharding_modes(0) == ("allgather", "ulysses")  # 70-token shards gather, 250-token ones swap
    plan = loader.plan_of(1)
    assert plan.iterations and {mb.mode for it in plan.iterations for mb in it.microbatches} <= {"allgather", "ulysses"}
    assert loader.state_dict()["cp_modes"] == ["allgather", "ulysses"]
    plain = make_loader(plans)
    assert "cp_modes" not in plain.request_document(0) and plain.sharding_modes(0) == ("allgather",)
    with pytest.raises(RequestError) as other:  # a state saved under other modes is not resumed here
        plain.load_state_dict(loader.state_dict())
    assert other.value.field == "state_dict.cp_modes"
    with pytest.raises(RequestError) as past:
        loader.plan_of(2)
    assert (past.value.field, past.value.value) == ("iteration", 2)
    for each in (loader, plain):
        each.close()
    plans.close()


def test_bad_modes_and_a_profile_that_cannot_price_ulysses_are_refused_naming_the_field() -> None:
    plans = LocalPlans()
    for bad, field in (("ulysses", "cp_modes"), (["ring"], "cp_modes[0]"), ([], "cp_modes")):
        with pytest.raises(RequestError) as info:
            make_loader(plans, cp_modes=bad)
        assert info.value.field == field
    no_heads = {k: v for k, v in mixed_profile().items() if k != "heads"}
    with pytest.raises(RequestError) as missing:
        make_loader(plans, profile=no_heads, cp_modes=["ulysses"])
    assert missing.value.field == "profile.heads"
    plans.close()


def test_each_microbatch_carries_the_heads_its_plan_was_made_for_where_ulysses_is_allowed() -> None:
    """``scheduled_step`` compares them with the model's on every rank (a loop that never called
    ``check_model_heads``); with all-gather only the heads do not matter and none are carried."""
    plans = LocalPlans()
    mixed = make_loader(plans, cp_modes=["allgather", "ulysses"])
    plain = make_loader(plans)
    first = next(iter(mixed))
    assert first.microbatches and {mb.plan_heads for mb in first.microbatches} == {(4, 2)}
    assert {mb.plan_heads for mb in next(iter(plain)).microbatches} == {None}
    for each in (mixed, plain):
        each.close()
    plans.close()

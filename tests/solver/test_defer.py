"""``defer``: the request field (read, written, refused), auto's deferral (valid, never worse per unit of
work, deterministic, bounded) and the validator's checks of its limits."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import skrull.solver.defer as defer_module
from skrull.solver.defer import keeps_defer, plan_with_deferral, removal_sizes, remove_sequences
from skrull.solver.errors import InvalidPlanError, RequestError
from skrull.solver.io import plan_to_dict, request_from_dict, request_to_dict
from skrull.solver.planners.base import PlannerOutput, make_spec
from skrull.solver.planning import assemble_plan, solve
from skrull.solver.types import Defer, Problem, Request
from skrull.solver.validate import defer_problems, plan_problems, validate_plan
from tests.conftest import HAND_PROFILE, make_request

#: Nine equal sequences on two GPUs: one GPU runs five, the other four; deferring one evens them.
ODD = [90] * 9


def _doc(**extra: Any) -> dict[str, Any]:
    return {"batches": [[10, 20, 30]], "parallel": {"dp": 2, "cp": 1}, "profile": HAND_PROFILE, **extra}


def _ids(plan_doc: dict[str, Any]) -> list[list[int]]:
    return [sorted(i for mb in it["microbatches"] for ids in mb["local"] for i in ids) for it in plan_doc["iterations"]]


def _without_wall(plan_doc: dict[str, Any]) -> dict[str, Any]:
    return {**plan_doc, "solve": {**plan_doc["solve"], "wall_ms": 0.0}}


def test_defer_is_read_and_written_back_unchanged() -> None:
    request = request_from_dict(_doc(defer={"max_sequences": 4, "carried": 2}))
    assert request.defer == Defer(max_sequences=4, carried=2)
    assert request_to_dict(request)["defer"] == {"max_sequences": 4, "carried": 2}
    assert request_from_dict(request_to_dict(request, inline_profile=True)) == request
    plain = request_from_dict(_doc(defer={"max_sequences": 0}))
    assert request_to_dict(plain)["defer"] == {"max_sequences": 0}
    for off in (_doc(), _doc(defer=None)):  # left out or null: off, and not written
        request = request_from_dict(off)
        assert request.defer is None and "defer" not in request_to_dict(request)


@pytest.mark.parametrize(
    ("defer", "field"),
    [
        (4, "defer"),
        ({}, "defer.max_sequences"),
        ({"max_sequences": -1}, "defer.max_sequences"),
        ({"max_sequences": True}, "defer.max_sequences"),
        ({"max_sequences": 1.5}, "defer.max_sequences"),
        ({"max_sequences": 1, "carried": 4}, "defer.carried"),  # the first batch holds 3
        ({"max_sequences": 1, "maximum": 2}, "defer.maximum"),
    ],
)
def test_a_bad_defer_is_refused_naming_the_field_and_value(defer: Any, field: str) -> None:
    with pytest.raises(RequestError) as caught:
        request_from_dict(_doc(defer=defer))
    assert caught.value.field == field
    assert caught.value.value == (defer.get(field.split(".")[-1]) if field != "defer" else defer)


@pytest.mark.parametrize("solver", ["skrull", "ilp", "hydraulis", "wlb", "deepspeed"])
def test_every_planner_but_auto_refuses_defer_naming_the_field(solver: str) -> None:
    with pytest.raises(RequestError) as caught:
        request_from_dict(_doc(solver=solver, defer={"max_sequences": 2}))
    assert caught.value.field == "defer"
    assert f"solver {solver!r} cannot honour it" in str(caught.value)
    if solver == "wlb":
        assert "wlb defers by its own outlier queues" in str(caught.value)
    # a Request built in Python, not read: solve refuses it the same way
    built = dataclasses.replace(request_from_dict(_doc(solver=solver)), defer=Defer(max_sequences=2))
    with pytest.raises(RequestError) as again:
        solve(built)
    assert again.value.field == "defer"


def test_auto_defers_the_ninth_sequence_that_would_make_a_straggler() -> None:
    request = make_request([ODD], dp=2, cp=1, solver="auto", defer={"max_sequences": 2}, deterministic=True)
    plan = solve(request)
    without = solve(dataclasses.replace(request, defer=None))
    validate_plan(plan, request)
    stats = plan.solve.stats_dict
    assert len(plan.pending) == stats["deferred_sequences"] == 1
    assert stats["ms_per_work"] < stats["ms_per_work_without_defer"] * (1 - 1e-3)
    problem = Problem.from_request(request)
    work = lambda p: sum(  # noqa: E731  # solver.metrics.work_ms of what each plan runs
        problem.profile.compute.ms_per_tflop / 1e12 * (1e9 * problem.lengths[i] + 1e5 * problem.lengths[i] ** 2)
        + HAND_PROFILE["microbatch_ms"] * problem.lengths[i] / 100
        for it in p.iterations
        for mb in it.microbatches
        for i in mb.seq_ids
    )
    assert plan.estimated_ms / work(plan) < without.estimated_ms / work(without)


@pytest.mark.parametrize("k", [0, 1, 2, 4])
@pytest.mark.parametrize(
    "batches", [[ODD], [ODD, [90] * 8], [[50] * 5 + [90] * 4, [20, 90, 90], [90] * 7], [[100, 3, 3, 3, 3]]]
)
def test_auto_with_defer_is_valid_bounded_never_worse_per_work_and_deterministic(
    batches: list[list[int]], k: int
) -> None:
    request = make_request(
        batches, dp=2, cp=1, solver="auto", defer={"max_sequences": k}, deterministic=True, time_budget_s=0.05
    )
    plan = solve(request)  # validated inside: a violation would be a PlannerBugError
    assert plan_problems(plan, request) == []
    assert len(plan.pending) <= k
    if k:
        stats = plan.solve.stats_dict
        assert stats["ms_per_work"] <= stats["ms_per_work_without_defer"]
        assert stats["deferred_sequences"] <= k * len(batches)
    assert _without_wall(plan_to_dict(solve(request))) == _without_wall(plan_to_dict(plan))


def test_carried_sequences_run_in_the_first_iteration_and_never_wait_twice() -> None:
    # the first two nines were deferred by the previous request: only the other seven may wait again
    request = make_request(
        [ODD, [90] * 8], dp=2, cp=1, solver="auto", defer={"max_sequences": 4, "carried": 2}, deterministic=True
    )
    plan = solve(request)
    runs = _ids(plan_to_dict(plan))
    assert {0, 1} <= set(runs[0])
    assert not {0, 1} & set(plan.pending)


@pytest.mark.parametrize("solver", ["skrull", "ilp", "deepspeed", "packed"])
def test_a_defer_of_zero_is_taken_by_every_planner_that_keeps_batches(solver: str) -> None:
    """``max_sequences`` 0 asks nothing (a loader's last chunk, one config for several planners): the same
    plan as without ``defer``; ``wlb``, whose queues move work, still refuses it."""
    doc = _doc(solver=solver, defer={"max_sequences": 0, "carried": 1}, deterministic=True, time_budget_s=0.5)
    with_zero = request_from_dict(doc)
    assert with_zero.defer == Defer(max_sequences=0, carried=1) and not with_zero.deferring
    without = dataclasses.replace(with_zero, defer=None)
    assert _ids(plan_to_dict(solve(with_zero))) == _ids(plan_to_dict(solve(without)))
    with pytest.raises(RequestError) as caught:
        request_from_dict(_doc(solver="wlb", defer={"max_sequences": 0}))
    assert caught.value.field == "defer" and "wlb defers by its own outlier queues" in str(caught.value)
    built = dataclasses.replace(request_from_dict(_doc(solver="wlb")), defer=Defer(max_sequences=0))
    with pytest.raises(RequestError, match="cannot honour"):
        solve(built)


def test_a_defer_of_zero_with_carried_sequences_is_planned_batch_by_batch_as_the_service_streams_it() -> None:
    """A planner that plans each batch alone is solved (and published) batch by batch
    (``planning.solve_batch``): ``carried`` counts the head of batch 0, not of every batch."""
    from skrull.solver.planning import solve_batch

    request = request_from_dict(
        _doc(solver="packed", batches=[[100, 100], [100], [30, 40, 50]], defer={"max_sequences": 0, "carried": 2})
    )
    whole = solve(request)
    for index in range(3):
        got = solve_batch(request, index)
        assert sorted(i for mb in got.iteration.microbatches for i in mb.seq_ids) == sorted(
            i for mb in whole.iterations[index].microbatches for i in mb.seq_ids
        )
        assert got.pending == ()


def test_zero_defers_nothing_and_is_the_plan_auto_makes() -> None:
    request = make_request([ODD], dp=2, cp=1, solver="auto", deterministic=True, time_budget_s=0.05)
    zero = dataclasses.replace(request, defer=Defer(max_sequences=0, carried=3))
    assert solve(zero).iterations == solve(request).iterations
    assert solve(zero).pending == ()


def test_the_validator_checks_the_limits_of_defer() -> None:
    request = make_request(
        [[10, 20, 30], [40, 50]], dp=1, cp=1, bucket=1000, solver="auto", defer={"max_sequences": 1, "carried": 1}
    )
    problem = Problem.from_request(request)

    def plan_of(iterations: list[list[int]], pending: tuple[int, ...]) -> list[str]:
        specs = tuple((make_spec(step=0, ranks=(0,), local=[ids], sharded=[]),) for ids in iterations)
        output = PlannerOutput(iterations=specs, pending=pending)
        return plan_problems(assemble_plan(problem, output, solver="auto", wall_ms=0.0), request)

    assert plan_of([[0, 1, 2], [3, 4]], ()) == []
    assert plan_of([[0, 1], [2, 3]], (4,)) == []
    assert plan_of([[0, 1], [2, 3, 4]], ()) == []
    assert plan_of([[0, 2], [1, 3, 4]], ()) == []  # sequence 1 waits one iteration: allowed
    assert plan_of([[1, 2], [0, 3, 4]], ()) == [
        "iterations[1]: sequence 0 was carried from the previous request (defer.carried) and must run in iteration 0"
    ]
    assert plan_of([[0], [1, 2, 3, 4]], ()) == [
        "iterations[1]: batch 0 defers 2 sequences, more than defer.max_sequences = 1"
    ]
    assert plan_of([[0, 1, 2], [3]], (4,)) == []
    assert (
        plan_of([[0, 1, 2], []], (3, 4))[-1] == "pending: batch 1 defers 2 sequences, more than defer.max_sequences = 1"
    )
    assert plan_of([[0, 1], [3, 4]], (2,)) == [
        "pending: sequence 2 of batch 0 would wait 2 iterations, more than one iteration"
    ]
    with pytest.raises(InvalidPlanError):  # what solve() would report as the planner's bug
        specs = tuple((make_spec(step=0, ranks=(0,), local=[ids], sharded=[]),) for ids in [[0], [1, 2, 3, 4]])
        validate_plan(assemble_plan(problem, PlannerOutput(iterations=specs), solver="auto", wall_ms=0.0), request)


def test_max_wait_bounds_how_long_a_sequence_waits_and_which_batches_fill_pending() -> None:
    request = make_request(
        [[10], [20], [30]], dp=1, cp=1, bucket=1000, solver="auto", defer={"max_sequences": 1, "max_wait": 2}
    )
    assert request.defer == Defer(max_sequences=1, max_wait=2)
    assert request_to_dict(request)["defer"] == {"max_sequences": 1, "max_wait": 2}
    problem = Problem.from_request(request)

    def plan_of(iterations: list[list[int]], pending: tuple[int, ...], checked: Request = request) -> list[str]:
        specs = tuple(((make_spec(step=0, ranks=(0,), local=[ids], sharded=[]),) if ids else ()) for ids in iterations)
        output = PlannerOutput(iterations=specs, pending=pending)
        return plan_problems(assemble_plan(problem, output, solver="auto", wall_ms=0.0), checked)

    assert plan_of([[], [1], [0, 2]], ()) == []  # batch 0's sequence waits two iterations: allowed
    assert plan_of([[0], [], [2]], (1,)) == []  # batch 1's waits until the next request: two iterations
    assert plan_of([[], [1], [2]], (0,)) == [
        "pending: sequence 0 of batch 0 would wait 3 iterations, more than 2 iterations (defer.max_wait)"
    ]
    one = dataclasses.replace(request, defer=Defer(max_sequences=1))
    assert plan_of([[], [1], [0, 2]], (), one) == ["iterations[2]: sequence 0 of batch 0 waits more than one iteration"]
    assert request_from_dict(request_to_dict(request, inline_profile=True)) == request
    for bad in (0, -1, True, 1.5):
        with pytest.raises(RequestError) as caught:
            request_from_dict(_doc(defer={"max_sequences": 1, "max_wait": bad}))
        assert caught.value.field == "defer.max_wait" and caught.value.value == bad


def test_auto_keeps_a_whole_request_plan_that_waits_longer_only_where_max_wait_allows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """WLB-LLM's queues may hold an outlier past the next iteration (bench/never_behind.py: ``wlb`` leaving a
    sequence of batch 0 pending past a 4-batch request). Its whole plan is kept only under a ``max_wait``
    that allows it, and the plan returned passes the validator either way."""
    request = make_request(
        [[300, 20, 30], [40, 50, 60], [70, 80, 90]], dp=1, cp=1, bucket=1000, solver="auto",
        deterministic=True, time_budget_s=0.2,
    )  # fmt: skip
    runs = [[1, 2], [3, 4, 5], [6, 7, 8, 0]]  # sequence 0 (batch 0) waits two iterations
    whole = PlannerOutput(iterations=tuple((make_spec(step=0, ranks=(0,), local=[ids], sharded=[]),) for ids in runs))
    monkeypatch.setattr(defer_module, "_start_peer", lambda *args, **kwargs: (whole, None))
    real = defer_module.per_work_ms

    def favour_whole(iterations: Any, *args: Any) -> float:  # the whole plan is the better one per unit of work
        return 0.5 * real(iterations, *args) if list(iterations) == list(whole.iterations) else real(iterations, *args)

    monkeypatch.setattr(defer_module, "per_work_ms", favour_whole)
    waits_two = solve(dataclasses.replace(request, defer=Defer(max_sequences=1, max_wait=2)))
    assert _ids(plan_to_dict(waits_two)) == [sorted(ids) for ids in runs]
    waits_one = solve(dataclasses.replace(request, defer=Defer(max_sequences=1)))
    assert 0 in {i for mb in waits_one.iterations[0].microbatches for i in mb.seq_ids} | {
        i for mb in waits_one.iterations[1].microbatches for i in mb.seq_ids
    }


def test_three_batches_chain_a_wait_of_at_most_one_iteration() -> None:
    request = make_request(
        [[90] * 3, [90] * 3, [90] * 3], dp=1, cp=1, solver="auto", defer={"max_sequences": 2}, deterministic=True
    )
    plan = plan_with_deferral(Problem.from_request(request), Defer(max_sequences=2))
    assert len(plan.iterations) == 3 and all(plan.iterations)  # no iteration is left empty


def test_removal_sizes_and_removing_sequences() -> None:
    assert removal_sizes(0) == [] and removal_sizes(1) == [1] and removal_sizes(8) == [1, 2, 4, 8]
    assert removal_sizes(6) == [1, 2, 4, 6]
    spec = make_spec(step=0, ranks=(0, 1), local=[[1], [2]], sharded=[3])
    assert remove_sequences([spec], {3}) == [make_spec(step=0, ranks=(0, 1), local=[[1], [2]], sharded=[])]
    assert remove_sequences([spec], {1, 2, 3}) == []


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=4),
    max_sequences=st.integers(min_value=0, max_value=2),
    max_wait=st.integers(min_value=1, max_value=3),
    data=st.data(),
)
def test_keeps_defer_agrees_with_the_validator(
    sizes: list[int], max_sequences: int, max_wait: int, data: st.DataObject
) -> None:
    """``keeps_defer`` (a whole-request plan auto may take) against the validator's own deferral checks:
    every sequence placed in its batch's iteration, one to three later, or pending, under waits of 1-3."""
    carried = data.draw(st.integers(min_value=0, max_value=sizes[0]))
    request = make_request(
        [[10 * (b + 1)] * n for b, n in enumerate(sizes)], dp=1, cp=1, bucket=1000, solver="auto",
        defer={"max_sequences": max_sequences, "carried": carried, "max_wait": max_wait},
    )  # fmt: skip
    problem = Problem.from_request(request)
    where = {i: data.draw(st.sampled_from([0, 1, 2, 3, "pending"])) for ids in problem.batch_ids for i in ids}
    batch_of = {i: b for b, ids in enumerate(problem.batch_ids) for i in ids}
    runs: list[list[int]] = [[] for _ in sizes]
    pending = []
    for i, w in where.items():
        k = batch_of[i] + w if w != "pending" else None
        if k is None or k >= len(sizes):
            pending.append(i)
        else:
            runs[k].append(i)
    specs = tuple(((make_spec(step=0, ranks=(0,), local=[ids], sharded=[]),) if ids else ()) for ids in runs)
    output = PlannerOutput(iterations=specs, pending=tuple(pending))
    plan = assemble_plan(problem, output, solver="auto", wall_ms=0.0)
    assert keeps_defer(output, problem, request.defer) == (defer_problems(plan, request) == [])


def test_auto_with_defer_is_not_behind_wlb_where_wlb_moves_a_batchs_outliers_into_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The request ``auto`` was behind ``wlb`` on in bench/never_behind.py
    (docs/results/2026-11-28-auto-notebook.md): Llama-2-70B at TP 8 on B200 (derived), DP2 x CP32, two
    batches of 256, four outliers in each. ``wlb`` moves batch 0's outliers into batch 1; the per-batch rule
    never does (iteration 0 alone is worse per unit of work without them). With ``defer`` as much as ``wlb``
    used, ``auto`` weighs ``wlb``'s whole plan and is not behind."""
    from skrull.solver.cost import CostModel
    from skrull.solver.lengths.datasets import load_distribution
    from skrull.solver.metrics import work_ms
    from skrull.solver.profiles.derive import TrainingSetup, derive_profile
    from skrull.solver.profiles.gpus import GPUS
    from skrull.solver.profiles.hf_config import model_from_hf_config
    from skrull.solver.types import Parallel, Request

    config = {"hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
              "intermediate_size": 28672, "vocab_size": 32000, "model_type": "llama"}  # fmt: skip
    profile = derive_profile(
        model_from_hf_config(config, name="llama2-70b"), GPUS["b200-180g"], TrainingSetup(tp=8, dp=8, zero_stage=3)
    )
    # the benchmark's setting, without the gathered K/V (there wlb's packs hold fewer tokens and it is no
    # longer ahead of the per-batch rule: tests/solver/test_gathered_kv.py covers that memory)
    profile = dataclasses.replace(profile, kv_bytes_per_token=None)
    short = [int(n) for n in load_distribution("llama3-sft-mix").sample(504, np.random.default_rng(2))]
    outliers = [731401, 642692, 423238, 429439, 517702, 666244, 581609, 646877]
    request = Request(
        batches=(tuple(short[:252] + outliers[:4]), tuple(short[252:] + outliers[4:])),
        parallel=Parallel(dp=2, cp=32), profile=profile, solver="auto", deterministic=True, time_budget_s=0.5,
        defer=Defer(max_sequences=4),
    )  # fmt: skip
    lengths = [n for batch in request.batches for n in batch]
    model = CostModel(profile, bucket_tokens=request.bucket_tokens)

    def per_work(plan: Any) -> float:
        return plan.estimated_ms / work_ms(plan, lengths, model)

    wlb = solve(dataclasses.replace(request, solver="wlb", defer=None, deterministic=False, time_budget_s=None))
    assert per_work(solve(request)) <= per_work(wlb) * (1 + 1e-9)
    # the request tells: the per-batch rule alone is behind here
    monkeypatch.setattr(defer_module, "_start_peer", lambda *args, **kwargs: (None, None))
    assert per_work(solve(request)) > per_work(wlb) * 1.001


def test_deferral_keeps_back_finishing_time_for_each_microbatch_of_the_batchs_base_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As ``auto`` does: estimating and validating grows with the microbatches, and with a per-sequence share
    alone 65,536 Mooncake sequences with a deferral ran 10.83 s of a 10 s budget. On the work clock the first
    option's search deadline moves by exactly ``NO_DEFER_SHARE`` of the reserve, and the batch reports it."""
    import skrull.solver.search.budget as budget_module
    from skrull.solver.search.budget import FINISH_RESERVE_PER_MICROBATCH_S, MICROBATCH_GROWTH

    request = make_request([ODD], dp=2, cp=1, solver="auto", defer={"max_sequences": 2}, deterministic=True)
    deadlines: list[float] = []
    choices: list[Any] = []
    real_search, real_plan_batch = defer_module.search_iteration, defer_module.plan_batch

    def search(*args: Any, deadline: float, **kwargs: Any) -> Any:
        deadlines.append(deadline)
        return real_search(*args, deadline=deadline, **kwargs)

    def plan_batch(*args: Any, **kwargs: Any) -> Any:
        choices.append(real_plan_batch(*args, **kwargs))
        return choices[-1]

    monkeypatch.setattr(defer_module, "search_iteration", search)
    monkeypatch.setattr(defer_module, "plan_batch", plan_batch)
    kept = solve(request)
    first_kept, reserve_s = deadlines[0], choices[0].finish_reserve_s
    deadlines.clear()
    monkeypatch.setattr(budget_module, "FINISH_RESERVE_PER_MICROBATCH_S", 0.0)
    unkept = solve(request)
    assert choices[-1].finish_reserve_s == 0.0
    assert reserve_s >= FINISH_RESERVE_PER_MICROBATCH_S * MICROBATCH_GROWTH  # one microbatch at least
    assert deadlines[0] - first_kept == pytest.approx(defer_module.NO_DEFER_SHARE * reserve_s, rel=1e-9)
    validate_plan(kept, request)
    validate_plan(unkept, request)

"""Worker views: zigzag ranges cover every sharded token exactly once; buffers are laid out as stated."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skrull.solver.errors import RequestError
from skrull.solver.planners.base import PlannerOutput, make_spec
from skrull.solver.planning import assemble_plan, solve
from skrull.solver.types import Problem
from skrull.solver.validate import validate_plan
from skrull.solver.worker_view import plan_rank_view, zigzag_chunks, zigzag_ranges
from tests.conftest import make_request


def test_contract_example_ranges() -> None:
    # 31000 tokens over 8 GPUs: 16 chunks of 1937 or 1938 (31000 = 16*1937 + 8)
    chunks = zigzag_chunks(31000, 8)
    assert [e - s for s, e in chunks] == [1938] * 8 + [1937] * 8
    assert zigzag_ranges(31000, 8, 5) == (chunks[5], chunks[10])


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5000), st.integers(1, 16))
def test_zigzag_covers_each_token_once_and_balances(num_tokens: int, group: int) -> None:
    covered = []
    sizes = []
    for p in range(group):
        ranges = zigzag_ranges(num_tokens, group, p)
        sizes.append(sum(e - s for s, e in ranges))
        for s, e in ranges:
            covered.extend(range(s, e))
    assert sorted(covered) == list(range(num_tokens))
    assert max(sizes) - min(sizes) <= 2


def test_rank_views_cover_every_token_of_the_iteration_once() -> None:
    request = make_request([[30, 45, 7, 90, 12, 3, 60]], dp=2, cp=3, bucket=40)
    plan = solve(request)
    lengths = [s for b in request.batches for s in b]
    tokens: dict[int, list[int]] = {i: [] for i in range(len(lengths))}
    for rank in range(6):
        view = plan_rank_view(plan, lengths, iteration=0, rank=rank)
        assert view.num_tokens_in_iteration == sum(lengths)
        assert [mb.step for mb in view.microbatches] == sorted(mb.step for mb in view.microbatches)
        for mb in view.microbatches:
            assert mb.ranks[mb.position] == rank
            pieces = [lengths[i] for i in mb.local] + [e - s for sh in mb.shards for s, e in sh.ranges]
            assert list(mb.cu_seqlens) == [sum(pieces[:k]) for k in range(len(pieces) + 1)]
            assert mb.max_seqlen == max(pieces, default=0)
            for i in mb.local:
                tokens[i].extend(range(lengths[i]))
            for sh in mb.shards:
                for s, e in sh.ranges:
                    tokens[sh.seq_id].extend(range(s, e))
    assert all(sorted(t) == list(range(lengths[i])) for i, t in tokens.items())


def test_unknown_iteration_or_rank_names_the_valid_range() -> None:
    request = make_request([[10, 20]], dp=1, cp=2)
    plan = solve(request)
    with pytest.raises(RequestError, match=r"0\.\.0"):
        plan_rank_view(plan, [10, 20], iteration=1, rank=0)
    with pytest.raises(RequestError, match=r"0\.\.1"):
        plan_rank_view(plan, [10, 20], iteration=0, rank=2)


def test_view_serializes_in_the_contract_shape() -> None:
    request = make_request([[10, 150]], dp=1, cp=2, bucket=100)
    plan = solve(request)
    doc = plan_rank_view(plan, [10, 150], iteration=0, rank=1).to_dict(plan_id="p1")
    assert set(doc) == {"plan_id", "iteration", "rank", "num_tokens_in_iteration", "max_microbatches", "microbatches"}
    mb = doc["microbatches"][0]
    assert set(mb) == {"step", "ranks", "position", "local", "shards", "cu_seqlens", "max_seqlen"}
    assert mb["shards"][0]["id"] == 1 and mb["shards"][0]["length"] == 150


@pytest.mark.parametrize("mode", ["per-sequence", "per-document"])
def test_views_of_other_sharding_modes_cover_every_token_once(mode: str) -> None:
    request = make_request([[37, 5, 120, 9]], dp=1, cp=3, bucket=100)
    problem = Problem.from_request(request)
    spec = make_spec(step=0, ranks=(0, 1, 2), local=[(), (), ()], sharded=[0, 1, 2, 3], sharding=mode)
    plan = assemble_plan(problem, PlannerOutput(iterations=((spec,),)), solver="hand", wall_ms=0.0)
    validate_plan(plan, request)
    lengths = list(problem.lengths)
    tokens: dict[int, list[int]] = {i: [] for i in range(4)}
    held = []
    for rank in range(3):
        view = plan_rank_view(plan, lengths, iteration=0, rank=rank)
        (mb,) = view.microbatches
        assert mb.sharding == mode and view.to_dict()["microbatches"][0]["sharding"] == mode
        assert [s.seq_id for s in mb.shards] == [0, 1, 2, 3]  # an entry per sharded sequence, even if empty
        pieces = [e - s for sh in mb.shards for s, e in sh.ranges]
        assert list(mb.cu_seqlens) == [sum(pieces[:k]) for k in range(len(pieces) + 1)]
        held.append(mb.num_tokens)
        for sh in mb.shards:
            for s, e in sh.ranges:
                tokens[sh.seq_id].extend(range(s, e))
    assert all(sorted(t) == list(range(lengths[i])) for i, t in tokens.items())
    assert max(held) - min(held) <= (1 if mode == "per-document" else 2)


def _all_sharded_plan(cp: int) -> tuple:
    lengths = [cp * 3 + k for k in range(5)]
    request = make_request([lengths], dp=1, cp=cp, bucket=100, solver="deepspeed")
    return solve(request), lengths


def _lines_run(call: Callable[[], object]) -> int:
    """Python lines executed by ``call()``: a measure of its work that the machine's load cannot change."""
    count = 0

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(None)
    return count


def test_a_rank_view_costs_what_the_rank_runs_not_its_group_size() -> None:
    # the same plan shape over 64 and 8,192 GPUs: a view's cost must not grow with the group (it used to
    # cut every position of every sharded sequence to keep one). Counted in Python lines run, not in
    # seconds, so the machine's load cannot decide it (the timings are bench/views.py's)
    work = []
    for cp in (64, 8192):
        plan, lengths = _all_sharded_plan(cp)
        plan_rank_view(plan, lengths, iteration=0, rank=1)  # builds the iteration's index once
        ranks = range(0, cp, cp // 32)
        views = functools.partial(
            lambda p, ls, rs: [plan_rank_view(p, ls, iteration=0, rank=r) for r in rs], plan, lengths, ranks
        )
        work.append(_lines_run(views))
        view = plan_rank_view(plan, lengths, iteration=0, rank=cp - 1)
        assert view.max_microbatches == len(view.microbatches) == len(plan.iterations[0].microbatches)
    assert 0 < work[1] <= 1.5 * work[0], work


@pytest.mark.parametrize("solver", ["skrull", "auto", "dynamic-cp", "wlb"])
def test_every_view_states_the_iterations_largest_microbatch_count(solver: str) -> None:
    request = make_request([[30, 45, 7, 90, 12, 3, 60, 150, 5, 5, 8]], dp=2, cp=3, bucket=60, solver=solver)
    plan = solve(request)
    lengths = [s for b in request.batches for s in b]
    views = [plan_rank_view(plan, lengths, iteration=0, rank=r) for r in range(6)]
    counts = [len(v.microbatches) for v in views]
    assert {v.max_microbatches for v in views} == {max(counts)}

"""Microbatch layouts: packed buffers as the worker view says, gathered rows that cover every shard once."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skrull.solver.errors import RequestError
from skrull.solver.planning import solve
from skrull.solver.sharding import SHARDING_MODES, group_ranges
from skrull.solver.worker_view import plan_rank_view
from skrull.worker.layout import (
    MicrobatchLayout,
    ShardedSequence,
    check_sharding,
    contiguous_ranges,
    layouts_from_view_dict,
    rank_layouts,
)
from tests.conftest import make_request


@st.composite
def layouts(draw: st.DrawFn) -> MicrobatchLayout:
    size = draw(st.integers(1, 5))
    ranks = tuple(draw(st.permutations(range(size + 2)))[:size])
    mode = draw(st.sampled_from(SHARDING_MODES))
    sharded_lengths = draw(st.lists(st.integers(1, 40), max_size=3))
    cuts = group_ranges(mode, sharded_lengths, size)
    local = draw(st.lists(st.integers(1, 30), max_size=3))
    return MicrobatchLayout(
        step=0,
        ranks=ranks,
        position=draw(st.integers(0, size - 1)),
        local_ids=tuple(range(100, 100 + len(local))),
        local_lengths=tuple(local),
        sharded=tuple(
            ShardedSequence(seq_id=i, num_tokens=n, ranges=cuts[i]) for i, n in enumerate(sharded_lengths)
        ),
    )


@settings(max_examples=200, deadline=None)
@given(layouts())
def test_gather_index_hits_each_nonpadded_row_of_the_group_once(layout: MicrobatchLayout) -> None:
    index = layout.gather_index
    padded = layout.padded_piece_tokens
    assert len(index) == sum(layout.sharded_lengths)
    assert len(set(index)) == len(index)
    expected = set()
    for position in range(layout.group_size):
        slot = layout.slot_ranks.index(layout.ranks[position])
        expected |= set(range(slot * padded, slot * padded + layout.piece_tokens_at(position)))
    assert set(index) == expected


@settings(max_examples=200, deadline=None)
@given(layouts())
def test_buffer_rows_positions_and_key_prefixes_agree(layout: MicrobatchLayout) -> None:
    cu = layout.cu_seqlens
    assert cu[-1] == layout.num_tokens == len(layout.row_tokens) == len(layout.position_ids)
    assert layout.max_seqlen == max((b - a for a, b in itertools.pairwise(cu)), default=0)
    # local sequences restart at 0; pieces carry their global positions
    rows = layout.row_tokens
    first_piece = layout.num_local_tokens
    assert all(t == pos for (_, t), pos in zip(rows, layout.position_ids, strict=True))
    offset = 0
    for n in layout.local_lengths:
        assert [t for _, t in rows[offset : offset + n]] == list(range(n))
        offset += n
    assert [t for _, t in rows[first_piece:]] == [t for p in layout.pieces for t in range(p.start, p.end)]
    # each piece [a, b) gets the gathered rows of tokens 0..b-1 of its sequence, in order
    gather = layout.gather_index
    base = dict(zip((s.seq_id for s in layout.sharded), layout.sharded_cu_seqlens, strict=False))
    expected = [gather[base[p.seq_id] + t] for p in layout.pieces for t in range(p.end)]
    assert list(layout.key_prefix_index) == expected
    assert layout.piece_cu_seqlens_k[-1] == len(expected)


def test_slots_follow_ascending_global_rank_whatever_the_plan_order() -> None:
    layout = MicrobatchLayout(
        step=3,
        ranks=(5, 2, 7),
        position=0,
        local_ids=(),
        local_lengths=(),
        sharded=(ShardedSequence(seq_id=0, num_tokens=6, ranges=tuple(contiguous_ranges(6, 3, p) for p in range(3))),),
    )
    assert layout.slot_ranks == (2, 5, 7) and layout.slot == 1
    # position 0 (rank 5, slot 1) holds tokens 0-1; position 1 (rank 2, slot 0) holds 2-3; slot 2 holds 4-5
    assert layout.gather_index == (2, 3, 0, 1, 4, 5)


def test_layouts_match_the_worker_view_for_every_rank() -> None:
    request = make_request([[30, 45, 7, 90, 12, 3, 60], [5, 70]], dp=2, cp=3, bucket=40)
    plan = solve(request)
    lengths = [s for b in request.batches for s in b]
    for iteration in range(len(plan.iterations)):
        for rank in range(6):
            view = plan_rank_view(plan, lengths, iteration=iteration, rank=rank)
            mine = rank_layouts(plan, lengths, iteration=iteration, rank=rank)
            assert [m.cu_seqlens for m in mine] == [m.cu_seqlens for m in view.microbatches]
            assert [m.max_seqlen for m in mine] == [m.max_seqlen for m in view.microbatches]
            total, parsed = layouts_from_view_dict(view.to_dict(plan_id="p"))
            assert total == view.num_tokens_in_iteration
            assert parsed == mine


def test_contiguous_sharding_gives_each_position_one_block() -> None:
    request = make_request([[10, 150]], dp=1, cp=2, bucket=100)
    plan = solve(request)
    (layout,) = rank_layouts(plan, [10, 150], iteration=0, rank=1, sharding="contiguous")
    assert [(p.start, p.end) for p in layout.pieces] == [(75, 150)]
    assert contiguous_ranges(5, 3, 2) == ((4, 5),) and contiguous_ranges(2, 3, 2) == ()


def test_view_with_ranges_of_another_rule_is_refused_with_the_field() -> None:
    request = make_request([[10, 150]], dp=1, cp=2, bucket=100)
    plan = solve(request)
    doc = plan_rank_view(plan, [10, 150], iteration=0, rank=0).to_dict()
    doc["microbatches"][0]["shards"][0]["ranges"] = [[0, 75]]
    with pytest.raises(RequestError, match=r"shards\[id=1\]\.ranges"):
        layouts_from_view_dict(doc)


def test_malformed_view_and_unknown_sharding_name_the_field() -> None:
    with pytest.raises(RequestError, match="view"):
        layouts_from_view_dict({"microbatches": "nope", "num_tokens_in_iteration": 3})
    with pytest.raises(RequestError, match=r"view\.microbatches\[0\]"):
        layouts_from_view_dict({"num_tokens_in_iteration": 3, "microbatches": [{"step": 0}]})
    with pytest.raises(RequestError, match="sharding: 'spiral'"):
        check_sharding("spiral")

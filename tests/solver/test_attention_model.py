"""The tile-padded attention model: the closed-form tile count and the vectorised slowest position
equal the definitions they shortcut (every query tile with every key tile it needs; each position's
pieces summed)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from skrull.solver.attention_model import AttentionKernelModel
from skrull.solver.profile import profile_from_dict
from skrull.solver.sharding import per_document_layout, per_sequence_layout
from tests.conftest import HAND_PROFILE


def kernel_with_tile(tile: int) -> AttentionKernelModel:
    return AttentionKernelModel(profile_from_dict({**HAND_PROFILE, "attention_kernel": {"tile_rows": tile}}))


def pairs_tile_by_tile(start: int, end: int, tile: int) -> int:
    """Query tile k covers rows ``start + k*tile ..``; it needs keys ``0 .. min(end, its last row + 1)``,
    in whole key tiles."""
    pairs = 0
    row = start
    while row < end:
        pairs += tile * tile * -(-min(end, row + tile) // tile)
        row += tile
    return pairs


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 1 << 40), st.integers(-300, 1 << 16), st.sampled_from([1, 7, 64, 128]))
def test_padded_pairs_count_every_tile_pair(start: int, rows: int, tile: int) -> None:
    assert kernel_with_tile(tile).padded_pairs(start, start + rows) == pairs_tile_by_tile(start, start + rows, tile)


def test_padded_pairs_of_pieces_by_hand() -> None:
    kernel = kernel_with_tile(128)
    assert kernel.padded_pairs(0, 12) == 128 * 128  # a 12-row piece costs a whole tile
    # rows 100-227 need keys 0-227 (2 tiles), rows 228-299 keys 0-299 (3 tiles)
    assert kernel.padded_pairs(100, 300) == 128 * 128 * 5
    assert kernel.padded_pairs(300, 300) == 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 70_000), min_size=1, max_size=30),
    st.sampled_from([1, 2, 4, 8, 16]),
    st.sampled_from([per_sequence_layout, per_document_layout]),
)
def test_slowest_position_is_the_largest_per_position_sum(lengths: list[int], group_size: int, cut: object) -> None:
    kernel = kernel_with_tile(128)
    layout = cut(lengths, group_size)  # type: ignore[operator]
    each = [kernel.position_ms([r for doc in layout for r in doc[p]]) for p in range(group_size)]
    assert kernel.slowest_position_ms(layout, group_size) == max(each)


def test_slowest_position_of_huge_documents_is_exact() -> None:
    kernel = kernel_with_tile(128)
    layout = per_document_layout([1 << 40, 3 << 30], 4)
    each = [kernel.position_ms([r for doc in layout for r in doc[p]]) for p in range(4)]
    assert kernel.slowest_position_ms(layout, 4) == max(each)

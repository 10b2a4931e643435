"""Checks over rank views: together they must hold every token of every sequence exactly once."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def assert_views_cover_every_token_once(views: Iterable[dict[str, Any]], lengths: Sequence[int]) -> None:
    pieces: dict[int, list[tuple[int, int]]] = {}
    for view in views:
        for mb in view["microbatches"]:
            for seq_id in mb["local"]:
                pieces.setdefault(seq_id, []).append((0, lengths[seq_id]))
            for shard in mb["shards"]:
                assert shard["length"] == lengths[shard["id"]]
                pieces.setdefault(shard["id"], []).extend((a, b) for a, b in shard["ranges"])
            # the packed buffer holds exactly the local sequences and the shard pieces
            expected = [lengths[i] for i in mb["local"]] + [b - a for s in mb["shards"] for a, b in s["ranges"]]
            assert mb["cu_seqlens"] == [sum(expected[:k]) for k in range(len(expected) + 1)]
    assert sorted(pieces) == list(range(len(lengths))), "some sequence is in no rank view"
    for seq_id, ranges in pieces.items():
        position = 0
        for start, end in sorted(ranges):
            assert start == position, f"sequence {seq_id}: tokens {position}..{start} missing or doubled"
            position = end
        assert position == lengths[seq_id], f"sequence {seq_id}: covered up to {position} of {lengths[seq_id]}"

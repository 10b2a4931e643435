"""Where every token of one microbatch lives on one GPU: the packed buffer and the group's shard layout.

Pure Python (no torch), so the layout is built and property-tested without a process group.

The packed buffer of GPU ``ranks[position]`` holds its local sequences whole (plan order), then its
pieces of the sharded sequences (sequence order, then range order); ``cu_seqlens`` delimits every local
sequence and every piece (docs/formats.md "Rank view"). Position ids restart at 0 for each local sequence
and are the global token positions for shard pieces, so rotary embeddings see the same positions as
when the sequence runs whole.

Context parallelism needs the layout of the whole group, not only this GPU's part: which token ranges
every position holds (the microbatch's sharding mode, cut by ``solver.sharding.group_ranges``, the same
function ``solver.worker_view.rank_view`` cuts with; by default the 2N-chunk zigzag), and
the order of the group's members inside a process group (``slot``: process groups rank their members
in ascending global rank, whatever the order of ``ranks`` in the plan).

Gathered buffers are slot-major and padded: slot ``i`` contributes ``padded_piece_tokens`` rows (the
largest piece total over the group; shorter ones are zero-padded), so one fixed-size collective serves
every member. ``gather_index`` maps each token of each sharded sequence (sequence order, token order) to
its row in that buffer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from skrull.solver.cp_modes import DEFAULT_CP_MODE
from skrull.solver.errors import RequestError
from skrull.solver.sharding import (
    DEFAULT_SHARDING,
    SHARDING_MODES,
    contiguous_ranges,
    group_ranges,
    zigzag_ranges,
)
from skrull.solver.types import Iteration, Plan
from skrull.solver.worker_view import RankMicrobatch, plan_iteration, rank_view, rank_view_from_dict

Ranges = tuple[tuple[int, int], ...]

__all__ = ["SHARDING_MODES", "contiguous_ranges", "zigzag_ranges"]


def check_sharding(name: str, *, field: str = "sharding") -> str:
    """``name`` if it is a mode of ``solver.sharding.SHARDING_MODES``, else a ``RequestError``."""
    if name not in SHARDING_MODES:
        raise RequestError(field, name, f"unknown sharding; known: {', '.join(SHARDING_MODES)}")
    return name


@dataclass(frozen=True, slots=True, kw_only=True)
class Piece:
    """Tokens ``[start, end)`` of sequence ``seq_id`` (of ``seq_tokens`` tokens) held by one GPU."""

    seq_id: int
    seq_tokens: int
    start: int
    end: int

    @property
    def num_tokens(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardedSequence:
    """A sharded sequence and the ranges each position of the group holds (``ranges[p]``)."""

    seq_id: int
    num_tokens: int
    ranges: tuple[Ranges, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class MicrobatchLayout:
    """One GPU's part of one microbatch, plus what it must know of the rest of the group."""

    step: int
    ranks: tuple[int, ...]
    position: int
    local_ids: tuple[int, ...]
    local_lengths: tuple[int, ...]
    sharded: tuple[ShardedSequence, ...]
    #: how the sharded sequences' attention runs (the plan's ``mode``, solver/cp_modes.py)
    mode: str = DEFAULT_CP_MODE

    # --- the group --------------------------------------------------------------------------------
    @property
    def group_size(self) -> int:
        return len(self.ranks)

    @property
    def rank(self) -> int:
        return self.ranks[self.position]

    @property
    def slot_ranks(self) -> tuple[int, ...]:
        """Members in process-group order (ascending global rank)."""
        return tuple(sorted(self.ranks))

    @property
    def slot(self) -> int:
        return self.slot_ranks.index(self.rank)

    @property
    def communicates(self) -> bool:
        """Whether this microbatch needs collectives: sharded sequences over more than one GPU."""
        return self.group_size > 1 and bool(self.sharded)

    def pieces_at(self, position: int) -> tuple[Piece, ...]:
        return tuple(
            Piece(seq_id=s.seq_id, seq_tokens=s.num_tokens, start=a, end=b)
            for s in self.sharded
            for a, b in s.ranges[position]
        )

    def piece_tokens_at(self, position: int) -> int:
        return sum(p.num_tokens for p in self.pieces_at(position))

    @property
    def padded_piece_tokens(self) -> int:
        """Rows each slot contributes to a gathered buffer: the largest piece total in the group."""
        return max((self.piece_tokens_at(p) for p in range(self.group_size)), default=0)

    # --- this GPU's packed buffer ----------------------------------------------------------------
    @property
    def pieces(self) -> tuple[Piece, ...]:
        return self.pieces_at(self.position)

    @property
    def num_local_tokens(self) -> int:
        return sum(self.local_lengths)

    @property
    def num_piece_tokens(self) -> int:
        return sum(p.num_tokens for p in self.pieces)

    @property
    def num_tokens(self) -> int:
        return self.num_local_tokens + self.num_piece_tokens

    @property
    def segment_lengths(self) -> tuple[int, ...]:
        return self.local_lengths + tuple(p.num_tokens for p in self.pieces)

    @property
    def cu_seqlens(self) -> tuple[int, ...]:
        """Offsets of every local sequence and piece in the packed buffer (flash-attention spelling)."""
        return _cumsum(self.segment_lengths)

    @property
    def max_seqlen(self) -> int:
        return max(self.segment_lengths, default=0)

    @property
    def local_cu_seqlens(self) -> tuple[int, ...]:
        return _cumsum(self.local_lengths)

    @property
    def row_tokens(self) -> tuple[tuple[int, int], ...]:
        """``(seq_id, token position in its sequence)`` of every row of the packed buffer."""
        rows = [(i, t) for i, n in zip(self.local_ids, self.local_lengths, strict=True) for t in range(n)]
        rows.extend((p.seq_id, t) for p in self.pieces for t in range(p.start, p.end))
        return tuple(rows)

    @property
    def position_ids(self) -> tuple[int, ...]:
        """0..S-1 for each local sequence; global positions for shard pieces."""
        return tuple(t for _, t in self.row_tokens)

    # --- context parallelism: where the group's pieces sit in a gathered buffer --------------------
    @property
    def sharded_lengths(self) -> tuple[int, ...]:
        return tuple(s.num_tokens for s in self.sharded)

    @property
    def sharded_cu_seqlens(self) -> tuple[int, ...]:
        """Offsets of the whole sharded sequences, concatenated in order."""
        return _cumsum(self.sharded_lengths)

    @property
    def gather_index(self) -> tuple[int, ...]:
        """Row of the slot-major, padded gathered buffer holding each token of each sharded sequence."""
        padded = self.padded_piece_tokens
        offsets = self.sharded_cu_seqlens
        where = [-1] * offsets[-1]
        order = {s.seq_id: k for k, s in enumerate(self.sharded)}
        for position in range(self.group_size):
            row = self.slot_ranks.index(self.ranks[position]) * padded
            for piece in self.pieces_at(position):
                base = offsets[order[piece.seq_id]]
                for t in range(piece.start, piece.end):
                    where[base + t] = row
                    row += 1
        assert all(w >= 0 for w in where), "the group's ranges must cover every sharded token"
        return tuple(where)

    @property
    def key_prefix_index(self) -> tuple[int, ...]:
        """For each own piece ``[a, b)`` in order, the gathered rows of keys ``0..b-1`` of its sequence.

        A query at global position ``a + i`` attends to keys ``0..a+i``: with the keys of the prefix
        ``[0, b)`` and causal masking aligned to the bottom right (query i of q_len sees keys up to
        ``i + k_len - q_len``, flash-attention's convention), that is exactly the sequence's causal mask.
        """
        gather = self.gather_index
        offsets = self.sharded_cu_seqlens
        order = {s.seq_id: k for k, s in enumerate(self.sharded)}
        out: list[int] = []
        for piece in self.pieces:
            base = offsets[order[piece.seq_id]]
            out.extend(gather[base : base + piece.end])
        return tuple(out)

    @property
    def piece_cu_seqlens_q(self) -> tuple[int, ...]:
        return _cumsum(tuple(p.num_tokens for p in self.pieces))

    @property
    def piece_cu_seqlens_k(self) -> tuple[int, ...]:
        return _cumsum(tuple(p.end for p in self.pieces))


def _cumsum(values: Sequence[int]) -> tuple[int, ...]:
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    return tuple(out)


def layout_from_rank_microbatch(
    mb: RankMicrobatch, lengths: Mapping[int, int] | Sequence[int], *, sharding: str = DEFAULT_SHARDING
) -> MicrobatchLayout:
    """The layout of one worker-view microbatch; the rest of the group's ranges follow its sharding mode
    (the view's own, else ``sharding``), cut by ``solver.sharding.group_ranges`` as ``rank_view`` cuts.

    The view's own ranges, ``cu_seqlens`` and ``max_seqlen`` must agree with the mode (a view built
    with another rule is refused rather than silently mis-gathered).
    """
    mode = mb.sharding if mb.sharding != DEFAULT_SHARDING else check_sharding(sharding)
    cuts = group_ranges(mode, [s.num_tokens for s in mb.shards], len(mb.ranks))
    sharded = tuple(
        ShardedSequence(seq_id=s.seq_id, num_tokens=s.num_tokens, ranges=ranges)
        for s, ranges in zip(mb.shards, cuts, strict=True)
    )
    for s, view_shard in zip(sharded, mb.shards, strict=True):
        if s.ranges[mb.position] != view_shard.ranges:
            raise RequestError(
                f"microbatches[step={mb.step}].shards[id={s.seq_id}].ranges",
                [list(r) for r in view_shard.ranges],
                f"do not follow the {mode!r} sharding rule (expected {[list(r) for r in s.ranges[mb.position]]})",
            )
    layout = MicrobatchLayout(
        step=mb.step,
        ranks=mb.ranks,
        position=mb.position,
        local_ids=mb.local,
        local_lengths=tuple(lengths[i] for i in mb.local),
        sharded=sharded,
        mode=mb.mode,
    )
    if layout.cu_seqlens != mb.cu_seqlens or layout.max_seqlen != mb.max_seqlen:
        raise RequestError(
            f"microbatches[step={mb.step}].cu_seqlens", list(mb.cu_seqlens), "disagree with the sequence lengths"
        )
    return layout


def with_default_sharding(iteration: Iteration, sharding: str) -> Iteration:
    """The iteration with ``sharding`` in place of the default mode (a worker-side comparison of cuts;
    microbatches whose plan chose a mode keep it)."""
    check_sharding(sharding)
    if sharding == DEFAULT_SHARDING:
        return iteration
    return dataclasses.replace(
        iteration,
        microbatches=tuple(
            dataclasses.replace(mb, sharding=sharding) if mb.sharding == DEFAULT_SHARDING and mb.sharded else mb
            for mb in iteration.microbatches
        ),
    )


def rank_layouts(
    plan: Plan, lengths: Sequence[int], *, iteration: int, rank: int, sharding: str = DEFAULT_SHARDING
) -> tuple[MicrobatchLayout, ...]:
    """Every microbatch GPU ``rank`` takes part in during ``iteration``, in step order: the plan's own
    worker view (``solver.worker_view.rank_view``), laid out."""
    it = with_default_sharding(plan_iteration(plan, iteration), sharding)
    view = rank_view(it, lengths, parallel=plan.parallel, rank=rank)
    return tuple(layout_from_rank_microbatch(mb, lengths) for mb in view.microbatches)


def layouts_from_view_dict(doc: Any, *, sharding: str = DEFAULT_SHARDING) -> tuple[int, tuple[MicrobatchLayout, ...]]:
    """``(num_tokens_in_iteration, layouts)`` from a worker-view document (``GET .../ranks/{rank}``), read
    with ``solver.worker_view.rank_view_from_dict``.

    Local sequence lengths are read off ``cu_seqlens``; shard lengths off ``shards[].length``.
    """
    view = rank_view_from_dict(doc)
    layouts = []
    for mb in view.microbatches:
        cu = mb.cu_seqlens
        local_lengths = {i: cu[j + 1] - cu[j] for j, i in enumerate(mb.local)}
        layouts.append(layout_from_rank_microbatch(mb, local_lengths, sharding=sharding))
    return view.num_tokens_in_iteration, tuple(layouts)

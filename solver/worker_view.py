"""One GPU's part of a plan (docs/formats.md "Rank view"): what the service serves and the worker runs.

Sharding of a sequence of S tokens over a group of N GPUs (default "zigzag", the Llama-3 / load-balanced
ring layout): the sequence is cut into 2N contiguous chunks and position p holds chunks p and 2N-1-p, so
every position gets one early and one late chunk and causal attention work is balanced. When S is not
divisible by 2N, chunk k has ``S // 2N + 1`` tokens for ``k < S % 2N`` and ``S // 2N`` otherwise (the
remainder goes to the leading chunks, no padding); positions then differ by at most one token. A
sequence shorter than 2N tokens leaves some chunks, and possibly some positions, empty; empty ranges
are omitted.

A microbatch may name another ``sharding`` mode (``per-sequence`` or ``per-document``, WLB-LLM sec. 5;
the cuts are defined in ``solver/sharding.py``); its view then carries ``"sharding"`` and the ranges of
that mode. A sequence some position holds no token of still gets an entry there, with no ranges.

The packed buffer of a GPU for one microbatch holds its local sequences (in the plan's order) and then
its pieces of the sharded sequences (each piece in range order); ``cu_seqlens`` delimits every local
sequence and every piece, flash-attention's spelling (int offsets starting at 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from skrull.solver.errors import RequestError
from skrull.solver.sharding import layout
from skrull.solver.types import DEFAULT_SHARDING, Plan


def zigzag_chunks(num_tokens: int, group_size: int) -> list[tuple[int, int]]:
    """The 2N chunks ``[start, end)`` of a sequence, in order."""
    parts = 2 * group_size
    base, extra = divmod(num_tokens, parts)
    chunks = []
    start = 0
    for k in range(parts):
        end = start + base + (1 if k < extra else 0)
        chunks.append((start, end))
        start = end
    return chunks


def zigzag_ranges(num_tokens: int, group_size: int, position: int) -> tuple[tuple[int, int], ...]:
    """Token ranges position ``position`` of an N-GPU group holds: chunks p and 2N-1-p (non-empty)."""
    if not 0 <= position < group_size:
        raise ValueError(f"position {position} outside a group of {group_size}")
    chunks = zigzag_chunks(num_tokens, group_size)
    picked = (chunks[position], chunks[2 * group_size - 1 - position])
    return tuple(r for r in picked if r[1] > r[0])


@dataclass(frozen=True, slots=True, kw_only=True)
class Shard:
    seq_id: int
    num_tokens: int
    ranges: tuple[tuple[int, int], ...]

    @property
    def num_local_tokens(self) -> int:
        return sum(end - start for start, end in self.ranges)


@dataclass(frozen=True, slots=True, kw_only=True)
class RankMicrobatch:
    step: int
    ranks: tuple[int, ...]
    position: int
    local: tuple[int, ...]
    shards: tuple[Shard, ...]
    cu_seqlens: tuple[int, ...]
    max_seqlen: int
    sharding: str = DEFAULT_SHARDING

    @property
    def num_tokens(self) -> int:
        return self.cu_seqlens[-1]


@dataclass(frozen=True, slots=True, kw_only=True)
class RankView:
    iteration: int
    rank: int
    num_tokens_in_iteration: int
    microbatches: tuple[RankMicrobatch, ...]

    def to_dict(self, *, plan_id: str | None = None) -> dict[str, Any]:
        return {
            "plan_id": plan_id,
            "iteration": self.iteration,
            "rank": self.rank,
            "num_tokens_in_iteration": self.num_tokens_in_iteration,
            "microbatches": [
                {
                    "step": mb.step,
                    "ranks": list(mb.ranks),
                    "position": mb.position,
                    "local": list(mb.local),
                    "shards": [
                        {"id": s.seq_id, "length": s.num_tokens, "ranges": [list(r) for r in s.ranges]}
                        for s in mb.shards
                    ],
                    "cu_seqlens": list(mb.cu_seqlens),
                    "max_seqlen": mb.max_seqlen,
                    **({} if mb.sharding == DEFAULT_SHARDING else {"sharding": mb.sharding}),
                }
                for mb in self.microbatches
            ],
        }


def rank_view(plan: Plan, lengths: Sequence[int], *, iteration: int, rank: int) -> RankView:
    """GPU ``rank``'s microbatches of ``iteration``, in step order, with its shard ranges and buffer layout.

    ``lengths`` are the request's lengths by global sequence id. Unknown iterations or ranks are a
    ``RequestError`` naming the valid range.
    """
    if not 0 <= iteration < len(plan.iterations):
        raise RequestError("iteration", iteration, f"must be in 0..{len(plan.iterations) - 1}")
    num_gpus = plan.parallel.num_gpus
    if not 0 <= rank < num_gpus:
        raise RequestError("rank", rank, f"must be in 0..{num_gpus - 1}")
    it = plan.iterations[iteration]
    total = sum(lengths[i] for mb in it.microbatches for i in mb.seq_ids)
    mine = []
    for mb in sorted((mb for mb in it.microbatches if rank in mb.ranks), key=lambda m: m.step):
        position = mb.ranks.index(rank)
        local = mb.local[position]
        if mb.sharding == DEFAULT_SHARDING:
            shards = tuple(
                Shard(seq_id=i, num_tokens=lengths[i], ranges=zigzag_ranges(lengths[i], len(mb.ranks), position))
                for i in mb.sharded
            )
        else:
            cuts = layout(mb.sharding, [lengths[i] for i in mb.sharded], len(mb.ranks))
            shards = tuple(
                Shard(seq_id=i, num_tokens=lengths[i], ranges=cuts[k][position]) for k, i in enumerate(mb.sharded)
            )
        pieces = [lengths[i] for i in local] + [end - start for s in shards for start, end in s.ranges]
        cu = [0]
        for n in pieces:
            cu.append(cu[-1] + n)
        mine.append(
            RankMicrobatch(
                step=mb.step,
                ranks=mb.ranks,
                position=position,
                local=local,
                shards=shards,
                cu_seqlens=tuple(cu),
                max_seqlen=max(pieces, default=0),
                sharding=mb.sharding,
            )
        )
    return RankView(iteration=iteration, rank=rank, num_tokens_in_iteration=total, microbatches=tuple(mine))

"""One GPU's part of a plan (docs/formats.md "Rank view"): what the service serves and the worker runs.

``rank_view`` is the one function that turns a planned iteration into a GPU's view: the service renders
its answers with it (api/views.py), ``skrull execute`` and the training loop build their buffers from it
(worker/layout.py ``rank_layouts``), and the data loader checks the views it fetches against the same
cuts (``solver.sharding.group_ranges``). ``RankView.to_dict`` writes the view document and
``rank_view_from_dict`` reads it back.

Sharding of the sequences of a microbatch over its N GPUs follows the microbatch's ``sharding`` mode
(``solver.sharding``; the default ``zigzag`` cuts each sequence into 2N chunks, position p taking chunks
p and 2N-1-p, remainder tokens dealt round-robin over the microbatch so no GPU exceeds its bucket). A view
of a non-default mode carries ``"sharding"``. Every sharded sequence gets an entry at every position,
with no ranges where it holds no token.

Cost. A view costs time linear in what the rank itself runs, not in the size of its groups: the cut of
one position is O(sharded sequences) (``solver.sharding.position_ranges``), and which microbatches a rank
takes part in comes from an ``IterationIndex`` built once per iteration (O(microbatches x group size),
the size of the iteration itself) and kept for the last few iterations asked about. Each microbatch of the
view still lists its group's ``ranks``, as the format requires.

The view also states ``max_microbatches``: the most microbatches any GPU runs in the iteration, so a
consumer that must run a fixed number of steps (a Trainer's gradient accumulation, FSDP) pads exactly.

The packed buffer of a GPU for one microbatch holds its local sequences (in the plan's order) and then
its pieces of the sharded sequences (each piece in range order); ``cu_seqlens`` delimits every local
sequence and every piece, flash-attention's spelling (int offsets starting at 0).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, pairwise
from typing import Any

from skrull.solver.cp_modes import DEFAULT_CP_MODE, read_mode
from skrull.solver.errors import RequestError
from skrull.solver.jsonsafe import read_int, read_ints, read_list, read_object
from skrull.solver.plan import layout_fields
from skrull.solver.sharding import DEFAULT_SHARDING, chunks, position_ranges, read_sharding, zigzag_ranges
from skrull.solver.types import Iteration, Microbatch, Parallel, Plan

__all__ = [
    "IterationIndex",
    "RankMicrobatch",
    "RankView",
    "Shard",
    "plan_iteration",
    "plan_rank_view",
    "rank_view",
    "rank_view_from_dict",
    "zigzag_chunks",
    "zigzag_ranges",
]


def zigzag_chunks(num_tokens: int, group_size: int) -> list[tuple[int, int]]:
    """The 2N chunks ``[start, end)`` of a sequence, in order."""
    return chunks(num_tokens, 2 * group_size)


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
    #: how the shards' attention runs (solver/cp_modes.py): ``allgather`` or ``ulysses``
    mode: str = DEFAULT_CP_MODE

    @property
    def num_tokens(self) -> int:
        return self.cu_seqlens[-1]

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "step": self.step,
            "ranks": list(self.ranks),
            "position": self.position,
            "local": list(self.local),
            "shards": [
                {"id": s.seq_id, "length": s.num_tokens, "ranges": [list(r) for r in s.ranges]} for s in self.shards
            ],
            "cu_seqlens": list(self.cu_seqlens),
            "max_seqlen": self.max_seqlen,
            **layout_fields(self.sharding, self.mode),
        }
        return doc


@dataclass(frozen=True, slots=True, kw_only=True)
class RankView:
    iteration: int
    rank: int
    num_tokens_in_iteration: int
    microbatches: tuple[RankMicrobatch, ...]
    #: The most microbatches any GPU of the world runs in this iteration (>= ``len(microbatches)``).
    max_microbatches: int

    def to_dict(self, *, plan_id: str | None = None) -> dict[str, Any]:
        """The worker-view document (docs/formats.md "Worker view")."""
        return {
            "plan_id": plan_id,
            "iteration": self.iteration,
            "rank": self.rank,
            "num_tokens_in_iteration": self.num_tokens_in_iteration,
            "max_microbatches": self.max_microbatches,
            "microbatches": [mb.to_dict() for mb in self.microbatches],
        }

    def to_json(self, *, plan_id: str | None = None) -> bytes:
        """``to_dict`` as compact JSON (UTF-8), each distinct group's ``ranks`` list encoded once: at CP 4,096
        a view of 202 microbatches of one group lists 827,392 ranks, and encoding them dominated its cost."""
        encoded: dict[int, str] = {}
        doc = self.to_dict(plan_id=plan_id)
        if plan_id is not None and _RANKS_MARK in plan_id:
            return json.dumps(doc, separators=(",", ":")).encode()
        for mb, out in zip(self.microbatches, doc["microbatches"], strict=True):
            key = id(mb.ranks)
            if key not in encoded:
                encoded[key] = json.dumps(out["ranks"], separators=(",", ":"))
            out["ranks"] = f"{_RANKS_MARK}{key}{_RANKS_MARK}"
        text = json.dumps(doc, separators=(",", ":"))
        for key, ranks in encoded.items():
            text = text.replace(f'"{_RANKS_MARK}{key}{_RANKS_MARK}"', ranks)
        return text.encode()


#: Stands in for a ``ranks`` list while the rest of a view is encoded; no other string of a view holds it
#: (a plan id that does is encoded the plain way).
_RANKS_MARK = "@@ranks@@"


def _cumsum(values: Sequence[int]) -> tuple[int, ...]:
    out = [0]
    for v in values:
        out.append(out[-1] + v)
    return tuple(out)


def _rank_microbatch(mb: Microbatch, lengths: Sequence[int], position: int) -> RankMicrobatch:
    local = mb.local[position]
    cut = position_ranges(mb.sharding, [lengths[i] for i in mb.sharded], len(mb.ranks), position)
    shards = tuple(Shard(seq_id=i, num_tokens=lengths[i], ranges=cut[k]) for k, i in enumerate(mb.sharded))
    pieces = [lengths[i] for i in local] + [end - start for s in shards for start, end in s.ranges]
    return RankMicrobatch(
        step=mb.step,
        ranks=mb.ranks,
        position=position,
        local=local,
        shards=shards,
        cu_seqlens=_cumsum(pieces),
        max_seqlen=max(pieces, default=0),
        sharding=mb.sharding,
        mode=mb.mode,
    )


class IterationIndex:
    """Which microbatches every GPU takes part in (at which position) and the iteration's token count,
    built once per iteration so each rank view after it costs only what that rank runs.

    Microbatches are grouped by their ``ranks`` tuple first (a plan reuses few groups: one per CP group in
    the static layout, one per GPU for local-only microbatches), so building costs O(microbatches) tuple
    hashes plus O(sum of distinct group sizes), not O(microbatches x group size) in Python.
    """

    __slots__ = ("by_rank", "iteration", "lengths", "max_microbatches", "num_tokens")

    def __init__(self, iteration: Iteration, lengths: Sequence[int]) -> None:
        self.iteration = iteration
        self.lengths = lengths
        groups: dict[tuple[int, ...], list[Microbatch]] = {}
        total = 0
        for mb in sorted(iteration.microbatches, key=lambda m: m.step):
            groups.setdefault(mb.ranks, []).append(mb)
            total += sum(lengths[i] for i in chain.from_iterable(mb.local)) + sum(lengths[i] for i in mb.sharded)
        by_rank: defaultdict[int, list[tuple[list[Microbatch], int]]] = defaultdict(list)
        for ranks, members in groups.items():
            for position, g in enumerate(ranks):
                by_rank[g].append((members, position))
        self.by_rank = dict(by_rank)
        self.num_tokens = total
        self.max_microbatches = max(
            (sum(len(members) for members, _ in entries) for entries in self.by_rank.values()), default=0
        )

    def view(self, rank: int) -> RankView:
        """GPU ``rank``'s view (``rank_view``), microbatches in step order."""
        entries = self.by_rank.get(rank, [])
        mine = [(mb, position) for members, position in entries for mb in members]
        if len(entries) > 1:
            mine.sort(key=lambda e: e[0].step)
        return RankView(
            iteration=self.iteration.index,
            rank=rank,
            num_tokens_in_iteration=self.num_tokens,
            microbatches=tuple(_rank_microbatch(mb, self.lengths, p) for mb, p in mine),
            max_microbatches=self.max_microbatches,
        )


#: Indexes of the iterations most recently viewed, by the identity of the iteration and the lengths. An
#: entry holds both objects, so an id cannot be reused while its entry lives.
_INDEXES: OrderedDict[tuple[int, int], IterationIndex] = OrderedDict()
_INDEXES_KEPT = 8
_INDEXES_LOCK = threading.Lock()


def iteration_index(iteration: Iteration, lengths: Sequence[int]) -> IterationIndex:
    """The (cached) ``IterationIndex`` of ``iteration`` over ``lengths``."""
    key = (id(iteration), id(lengths))
    with _INDEXES_LOCK:
        index = _INDEXES.get(key)
        if index is not None and index.iteration is iteration and index.lengths is lengths:
            _INDEXES.move_to_end(key)
            return index
    index = IterationIndex(iteration, lengths)
    with _INDEXES_LOCK:
        _INDEXES[key] = index
        while len(_INDEXES) > _INDEXES_KEPT:
            _INDEXES.popitem(last=False)
    return index


def rank_view(iteration: Iteration, lengths: Sequence[int], *, parallel: Parallel, rank: int) -> RankView:
    """GPU ``rank``'s microbatches of ``iteration``, in step order, with its shard ranges and buffer layout.

    ``lengths`` are the request's lengths by global sequence id; the view's ``iteration`` is the
    iteration's own ``index``. A rank outside ``parallel`` is a ``RequestError`` naming the valid range.
    """
    num_gpus = parallel.num_gpus
    if not 0 <= rank < num_gpus:
        raise RequestError("rank", rank, f"must be in 0..{num_gpus - 1}")
    return iteration_index(iteration, lengths).view(rank)


def plan_iteration(plan: Plan, iteration: int) -> Iteration:
    """The plan's iteration number ``iteration`` (a ``RequestError`` naming the valid range otherwise)."""
    if not 0 <= iteration < len(plan.iterations):
        raise RequestError("iteration", iteration, f"must be in 0..{len(plan.iterations) - 1}")
    return plan.iterations[iteration]


def plan_rank_view(plan: Plan, lengths: Sequence[int], *, iteration: int, rank: int) -> RankView:
    """``rank_view`` of the plan's iteration number ``iteration``."""
    return rank_view(plan_iteration(plan, iteration), lengths, parallel=plan.parallel, rank=rank)


# -- reading a view document ----------------------------------------------------------------------------


def _shard_from_dict(doc: Any, field: str) -> Shard:
    doc = read_object(doc, field, shape='an object like {"id": 3, "length": 10, "ranges": [[0, 5]]}')
    ranges = read_list(doc.get("ranges"), f"{field}.ranges", of="[start, end) pairs")
    pairs = []
    for k, r in enumerate(ranges):
        pair = read_ints(r, f"{field}.ranges[{k}]", what="offsets")
        if len(pair) != 2 or pair[0] > pair[1]:
            raise RequestError(f"{field}.ranges[{k}]", r, "must be a pair [start, end) with start <= end")
        pairs.append((pair[0], pair[1]))
    return Shard(
        seq_id=read_int(doc.get("id"), f"{field}.id", minimum=0),
        num_tokens=read_int(doc.get("length"), f"{field}.length", minimum=1),
        ranges=tuple(pairs),
    )


def _rank_microbatch_from_dict(doc: Any, field: str) -> RankMicrobatch:
    doc = read_object(doc, field, shape="a worker-view microbatch object")
    shards = read_list(doc.get("shards"), f"{field}.shards", of="shard objects")
    sharding = read_sharding(doc.get("sharding", DEFAULT_SHARDING), f"{field}.sharding")
    cu = read_ints(doc.get("cu_seqlens"), f"{field}.cu_seqlens", what="offsets")
    local = read_ints(doc.get("local"), f"{field}.local")
    if len(cu) < len(local) + 1 or cu[0] != 0 or any(b < a for a, b in pairwise(cu)):
        raise RequestError(f"{field}.cu_seqlens", list(cu), "must rise from 0, one offset per local sequence and piece")
    return RankMicrobatch(
        step=read_int(doc.get("step"), f"{field}.step", minimum=0),
        ranks=read_ints(doc.get("ranks"), f"{field}.ranks", what="GPU ranks"),
        position=read_int(doc.get("position"), f"{field}.position", minimum=0),
        local=local,
        shards=tuple(_shard_from_dict(s, f"{field}.shards[{k}]") for k, s in enumerate(shards)),
        cu_seqlens=cu,
        max_seqlen=read_int(doc.get("max_seqlen"), f"{field}.max_seqlen", minimum=0),
        sharding=sharding,
        mode=read_mode(doc.get("mode"), f"{field}.mode"),
    )


def rank_view_from_dict(doc: Any) -> RankView:
    """Read a worker-view document (``GET /v1/plans/{id}/ranks/{rank}``); checks shape, not content."""
    if not isinstance(doc, dict) or not isinstance(doc.get("microbatches"), list):
        raise RequestError("view", doc, "must be a worker-view object with a 'microbatches' list")
    microbatches = tuple(
        _rank_microbatch_from_dict(m, f"view.microbatches[{k}]") for k, m in enumerate(doc["microbatches"])
    )
    return RankView(
        iteration=read_int(doc.get("iteration"), "view.iteration", minimum=0),
        rank=read_int(doc.get("rank"), "view.rank", minimum=0),
        num_tokens_in_iteration=read_int(doc.get("num_tokens_in_iteration"), "view.num_tokens_in_iteration", minimum=0),
        microbatches=microbatches,
        max_microbatches=read_int(
            doc.get("max_microbatches", len(microbatches)), "view.max_microbatches", minimum=len(microbatches)
        ),
    )

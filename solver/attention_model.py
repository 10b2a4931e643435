"""Predicted attention-kernel time of one CP position, with tile padding (WLB-LLM sec. 5.2-5.3).

WLB-LLM chooses per microbatch between per-sequence and per-document CP sharding by predicting the
attention kernel time of both layouts and taking the lower. Its predictor (sec. 5.3): the FLOPs of the
attention, with every document chunk padded to whole kernel tiles, divided by the throughput the kernel
achieves at that query length (measured offline; it rises sharply from 128 to 256 query rows on Hopper,
where TMA multicast starts to share K/V loads, Fig. 10).

Here, for one position holding pieces ``[a, b)`` of documents (causal masks, keys ``0..row`` of the
same document, all-gathered):

* the piece's query rows are cut into tiles of ``tile_rows`` (128, FlashAttention's forward tile); query
  tile t covers rows ``a + t*tile .. a + (t+1)*tile - 1`` and needs keys ``0 .. min(b, a + (t+1)*tile)``,
  rounded up to whole key tiles; every (query tile, key tile) pair is computed in full (the diagonal is
  masked inside the tile, not skipped), so a 12-row piece costs as much as a 128-row one;
* padded work = ``tile_rows^2 * (number of tile pairs)`` query-key pairs, each costing
  ``flops_per_token_sq`` FLOPs (the reference model's quadratic term, Skrull eq. 13 x layers x 3);
* time = ``ms_per_tflop * FLOPs / 1e12 / efficiency(query rows of the piece)``.

The efficiency curve is ``profile.extra["attention_kernel"]["efficiency_by_q_rows"]`` (pairs of query
rows and achieved fraction of the dense rate) when a measured profile provides it; otherwise the default
below, an assumption shaped after WLB-LLM Fig. 10 (flat up to 128 rows, a step at 256, saturating by 512).
It only ranks the two layouts of the same microbatch against each other; the plan's estimates stay the
reference model's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from skrull.solver.profile import Profile

TILE_ROWS = 128
#: Achieved fraction of the dense attention rate by padded query rows of a piece (assumed, after WLB Fig. 10).
DEFAULT_EFFICIENCY: tuple[tuple[int, float], ...] = ((128, 0.55), (256, 0.85), (512, 1.0))

Piece = tuple[int, int]  # [start, end) rows of one document
#: Pieces ending below this row are costed with int64 arrays (their tile pairs stay far below 2^63).
VECTOR_ROWS_LIMIT = 1 << 24


class AttentionKernelModel:
    """Tile-padded attention time of the pieces one GPU holds."""

    __slots__ = ("_eff_cache", "_eff_rows", "_eff_vals", "_ms_per_pair", "tile_rows")

    def __init__(self, profile: Profile) -> None:
        spec = profile.extra.get("attention_kernel", {}) if isinstance(profile.extra, dict) else {}
        self.tile_rows = int(spec.get("tile_rows", TILE_ROWS))
        table = spec.get("efficiency_by_q_rows", DEFAULT_EFFICIENCY)
        self._eff_rows = np.array([float(r) for r, _ in table])
        self._eff_vals = np.array([float(v) for _, v in table])
        self._ms_per_pair = profile.compute.ms_per_tflop * profile.compute.flops_per_token_sq / 1e12
        self._eff_cache: dict[int, float] = {}

    def efficiency(self, query_rows: int) -> float:
        padded = -(-query_rows // self.tile_rows) * self.tile_rows
        found = self._eff_cache.get(padded)
        if found is None:  # one interpolation per tile count (WLB-LLM's sharding choice asks thousands of times)
            found = self._eff_cache[padded] = float(np.interp(padded, self._eff_rows, self._eff_vals))
        return found

    def padded_pairs(self, start: int, end: int) -> int:
        """Query-key pairs computed for rows ``[start, end)`` of a causal document, whole tiles only.

        With tile size t, ``T = ceil((end - start) / t)`` query tiles and ``c = ceil(start / t)``: query
        tile k < T-1 ends at row ``start + (k+1)*t`` and needs ``c + k + 1`` key tiles, the last needs
        ``ceil(end / t)``, so ``pairs = t^2 * ((T-1)*c + T*(T-1)/2 + ceil(end / t))``."""
        if end <= start:
            return 0
        tile = self.tile_rows
        tiles = -(-(end - start) // tile)
        first = -(-start // tile)
        return tile * tile * ((tiles - 1) * first + tiles * (tiles - 1) // 2 + -(-end // tile))

    def piece_ms(self, start: int, end: int) -> float:
        if end <= start:
            return 0.0
        return self._ms_per_pair * self.padded_pairs(start, end) / self.efficiency(end - start)

    def position_ms(self, pieces: Sequence[Piece]) -> float:
        """Predicted attention time of one GPU's pieces (summed: varlen kernels run them in one launch)."""
        return sum(self.piece_ms(a, b) for a, b in pieces)

    def slowest_position_ms(self, layout: Sequence[Sequence[Sequence[Piece]]], group_size: int) -> float:
        """``max_p position_ms(pieces of every document at position p)`` for a layout indexed
        ``[document][position]``: the same sums, in the same order, costed in one vectorised pass
        (WLB-LLM's sharding choice asks for every microbatch of a plan)."""
        starts: list[int] = []
        ends: list[int] = []
        where: list[int] = []
        for p in range(group_size):
            for doc in layout:
                for piece_start, piece_end in doc[p]:
                    starts.append(piece_start)
                    ends.append(piece_end)
                    where.append(p)
        if not starts:
            return 0.0
        if max(ends) >= VECTOR_ROWS_LIMIT:  # tile pairs could overflow int64: Python integers
            return max(self.position_ms([r for doc in layout for r in doc[p]]) for p in range(group_size))
        tile = self.tile_rows
        a = np.array(starts, dtype=np.int64)
        b = np.array(ends, dtype=np.int64)
        rows = np.maximum(b - a, 0)
        tiles = -(-rows // tile)
        pairs = tile * tile * ((tiles - 1) * -(-a // tile) + tiles * (tiles - 1) // 2 + -(-b // tile))
        padded = (tiles * tile).astype(np.float64)
        eff = np.interp(padded, self._eff_rows, self._eff_vals)
        ms = np.where(rows > 0, self._ms_per_pair * pairs.astype(np.float64) / eff, 0.0)
        return float(np.bincount(np.array(where), weights=ms, minlength=group_size).max())

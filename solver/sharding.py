"""How a microbatch's sharded sequences are cut over the N GPUs of its group (``solver.types.SHARDING_MODES``).

All three modes give every position about ``sum(S) / N`` tokens, which is what the cost model charges
(eq. 7); they differ in which tokens, and so in how causal attention work and kernel tiles fall:

* ``zigzag`` (the default, Llama-3 style load-balanced ring layout, ``solver.worker_view``): every
  sequence is cut into 2N contiguous chunks, chunk k holding ``S // 2N + 1`` tokens for ``k < S % 2N``
  and ``S // 2N`` otherwise; position p takes chunks p and 2N-1-p.
* ``per-sequence`` (WLB-LLM sec. 3.1 / 5.1, "per-sequence sharding", what Plain-4D CP does): the sharded
  sequences are packed, in the microbatch's order, into one buffer of ``T = sum(S)`` tokens and that
  buffer is cut zigzag as above. Chunks are large (good kernel efficiency) but a document's late, heavy
  rows can land on few positions (CP imbalance).
* ``per-document`` (WLB-LLM sec. 5.1, padding-free per-document sharding): every document of length
  ``d = 2N*e + r`` is cut into 2N chunks of ``e = d // 2N`` tokens, position p taking chunks p and 2N-1-p;
  the ``r < 2N`` remaining tail tokens are dealt round-robin over the positions, continuing where the
  previous document's remainder stopped, so token counts differ by at most one over the microbatch and
  nothing is padded. The dealt tokens are laid out contiguously: the tail is cut into ``min(r, N)``
  consecutive pieces, piece k (of ``r // N + 1`` tokens for ``k < r % N``, else ``r // N``) going to
  position ``(start + k) mod N``; the count each position gets equals dealing the tokens one by one.

Every function returns ``ranges[k][p]``: the ``[start, end)`` token ranges of the k-th sequence that
position p holds, ascending, adjacent ranges merged, empty ones omitted; over all positions they cover
each sequence exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence

Ranges = tuple[tuple[int, int], ...]


def _chunks(num_tokens: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous chunks, the first ``num_tokens % parts`` one token longer (the zigzag rule of
    ``solver.worker_view.zigzag_chunks``, applied here to a packed buffer)."""
    base, extra = divmod(num_tokens, parts)
    chunks = []
    start = 0
    for k in range(parts):
        end = start + base + (1 if k < extra else 0)
        chunks.append((start, end))
        start = end
    return chunks


def _merge(ranges: list[tuple[int, int]]) -> Ranges:
    out: list[tuple[int, int]] = []
    for start, end in sorted(r for r in ranges if r[1] > r[0]):
        if out and out[-1][1] == start:
            out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return tuple(out)


def per_sequence_layout(lengths: Sequence[int], group_size: int) -> list[list[Ranges]]:
    """WLB-LLM's per-sequence sharding: the packed buffer of all sequences, cut zigzag."""
    n = group_size
    total = sum(lengths)
    chunks = _chunks(total, 2 * n)
    held = [(chunks[p], chunks[2 * n - 1 - p]) for p in range(n)]
    out: list[list[Ranges]] = []
    offset = 0
    for s in lengths:
        per_position: list[Ranges] = []
        for p in range(n):
            pieces = []
            for c_start, c_end in held[p]:
                start, end = max(c_start, offset), min(c_end, offset + s)
                if end > start:
                    pieces.append((start - offset, end - offset))
            per_position.append(_merge(pieces))
        out.append(per_position)
        offset += s
    return out


def per_document_layout(lengths: Sequence[int], group_size: int) -> list[list[Ranges]]:
    """WLB-LLM's padding-free per-document sharding (sec. 5.1): 2N equal chunks, remainder round-robin."""
    n = group_size
    out: list[list[Ranges]] = []
    deal = 0  # the position that receives the next remainder token
    for s in lengths:
        e, r = divmod(s, 2 * n)
        pieces: list[list[tuple[int, int]]] = [
            [(p * e, (p + 1) * e), ((2 * n - 1 - p) * e, (2 * n - p) * e)] for p in range(n)
        ]
        base, extra = divmod(r, n)
        start = 2 * n * e
        for k in range(min(r, n)):
            size = base + (1 if k < extra else 0)
            pieces[(deal + k) % n].append((start, start + size))
            start += size
        deal = (deal + r) % n
        out.append([_merge(p) for p in pieces])
    return out


def layout(mode: str, lengths: Sequence[int], group_size: int) -> list[list[Ranges]]:
    """``ranges[k][p]`` for a non-default sharding mode (the default ``zigzag`` lives in
    ``solver.worker_view``, one sequence at a time)."""
    if mode == "per-sequence":
        return per_sequence_layout(lengths, group_size)
    if mode == "per-document":
        return per_document_layout(lengths, group_size)
    raise ValueError(f"unknown sharding mode {mode!r}")

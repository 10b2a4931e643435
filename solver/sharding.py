"""The one vocabulary of how a microbatch's sharded sequences are cut over the N GPUs of its group.

The plan (``Microbatch.sharding``), the worker view, the worker's buffer layout (worker/layout.py) and
``skrull execute --sharding`` all name a cut by one of ``SHARDING_MODES`` and get its ranges from
``group_ranges``. Every mode gives every position about ``sum(S) / N`` tokens, which is what the cost
model charges (eq. 7); they differ in which tokens, and so in how causal attention work and kernel tiles
fall:

* ``zigzag`` (the default, the Llama-3 style load-balanced ring layout, docs/formats.md "Worker view"):
  every sequence is cut into 2N contiguous chunks, chunk k holding ``S // 2N + 1`` tokens for
  ``k < S % 2N`` and ``S // 2N`` otherwise (the remainder goes to the leading chunks, no padding);
  position p takes chunks p and 2N-1-p, so every position gets one early and one late chunk.
* ``contiguous`` (the plain ring layout): position p holds the p-th of N contiguous blocks (remainder to
  the leading blocks). Causal attention work is unbalanced (the last block attends to the whole
  sequence); no planner chooses it, the worker offers it for comparison.
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

``group_ranges`` returns ``ranges[k][p]``: the ``[start, end)`` token ranges of the k-th sequence that
position p holds, ascending, adjacent ranges merged, empty ones omitted; over all positions they cover
each sequence exactly once. A sequence shorter than 2N tokens leaves some positions empty.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from skrull.solver.errors import RequestError

Ranges = tuple[tuple[int, int], ...]
#: A cut of one sequence on its own: ``(num_tokens, group_size, position) -> ranges``.
SequenceRule = Callable[[int, int, int], Ranges]

DEFAULT_SHARDING = "zigzag"


def chunks(num_tokens: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous chunks ``[start, end)`` in order, the first ``num_tokens % parts`` one token
    longer (the zigzag rule's 2N chunks, also used on a packed buffer)."""
    base, extra = divmod(num_tokens, parts)
    out = []
    start = 0
    for k in range(parts):
        end = start + base + (1 if k < extra else 0)
        out.append((start, end))
        start = end
    return out


def _check_position(group_size: int, position: int) -> None:
    if not 0 <= position < group_size:
        raise ValueError(f"position {position} outside a group of {group_size}")


def zigzag_ranges(num_tokens: int, group_size: int, position: int) -> Ranges:
    """Token ranges position ``position`` of an N-GPU group holds: chunks p and 2N-1-p (non-empty)."""
    _check_position(group_size, position)
    cut = chunks(num_tokens, 2 * group_size)
    picked = (cut[position], cut[2 * group_size - 1 - position])
    return tuple(r for r in picked if r[1] > r[0])


def contiguous_ranges(num_tokens: int, group_size: int, position: int) -> Ranges:
    """Position p holds the p-th of N contiguous blocks (remainder to the leading blocks)."""
    _check_position(group_size, position)
    start, end = chunks(num_tokens, group_size)[position]
    return ((start, end),) if end > start else ()


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
    cut = chunks(sum(lengths), 2 * n)
    held = [(cut[p], cut[2 * n - 1 - p]) for p in range(n)]
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


#: Modes that cut each sequence on its own.
SEQUENCE_RULES: dict[str, SequenceRule] = {"zigzag": zigzag_ranges, "contiguous": contiguous_ranges}
#: Modes that cut the microbatch's sharded sequences together.
MICROBATCH_LAYOUTS: dict[str, Callable[[Sequence[int], int], list[list[Ranges]]]] = {
    "per-sequence": per_sequence_layout,
    "per-document": per_document_layout,
}
#: Every mode a plan, a worker view or the worker may name.
SHARDING_MODES: tuple[str, ...] = ("zigzag", "per-sequence", "per-document", "contiguous")


def group_ranges(mode: str, lengths: Sequence[int], group_size: int) -> list[tuple[Ranges, ...]]:
    """``ranges[k][p]`` of the sequences of ``lengths`` (in the microbatch's order) cut by ``mode``."""
    if mode in SEQUENCE_RULES:
        rule = SEQUENCE_RULES[mode]
        return [tuple(rule(s, group_size, p) for p in range(group_size)) for s in lengths]
    if mode in MICROBATCH_LAYOUTS:
        return [tuple(per_position) for per_position in MICROBATCH_LAYOUTS[mode](lengths, group_size)]
    raise ValueError(f"unknown sharding mode {mode!r}; known: {', '.join(SHARDING_MODES)}")


def layout(mode: str, lengths: Sequence[int], group_size: int) -> list[list[Ranges]]:
    """``group_ranges`` as lists (kept for callers that index and compare lists)."""
    return [list(per_position) for per_position in group_ranges(mode, lengths, group_size)]


def read_sharding(value: Any, field: str) -> str:
    """A plan's or a view's ``sharding`` field: one of ``SHARDING_MODES``."""
    if value not in SHARDING_MODES:
        raise RequestError(field, value, f"must be one of {', '.join(SHARDING_MODES)}")
    return str(value)

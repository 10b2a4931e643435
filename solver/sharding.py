"""The one function that cuts a microbatch's sharded sequences over the N GPUs of its group.

The plan (``Microbatch.sharding``), the cost model's memory check, the validator, the worker view, the
worker's buffer layout (worker/layout.py) and ``skrull execute --sharding`` all name a cut by one of
``SHARDING_MODES`` and get its ranges from ``position_ranges`` (one GPU, what a rank view needs) or
``group_ranges`` (every GPU, what the worker's collectives need), and each position's real token count
from ``position_token_counts``.

**Bucket-exact.** A memory bucket is a per-GPU limit in real tokens, not an average. Every mode deals the
tokens that do not divide evenly round-robin over the positions, *continuing where the previous sequence
of the microbatch stopped*, so over the whole microbatch every position holds ``floor(T / N)`` or
``ceil(T / N)`` of the ``T`` sharded tokens (pieces of one sequence differ by at most one token per
chunk). Hence for GPU j with ``L_j`` local tokens: ``L_j + ceil(T / N) <= bucket`` exactly when
``N * L_j + T <= N * bucket`` (``L_j`` and ``bucket`` are integers), the integer check planners use
(``CostModel.fits``); the validator checks each GPU's real count from ``position_token_counts``.
Before this rule zigzag gave every remainder token to the leading chunks, sequence by sequence, so three
sequences of 69,345 + 69,345 + 69,310 tokens over 8 GPUs put 26,001 tokens on GPU 0 of a 26,000 bucket.

The modes differ in which tokens a position holds, and so in how causal attention work and kernel tiles
fall:

* ``zigzag`` (the default, the Llama-3 style load-balanced ring layout, docs/formats.md "Worker view"):
  a sequence of ``S = 2N*e + r`` tokens (``r < 2N``) is cut into 2N contiguous chunks; position p takes
  chunks p and 2N-1-p, so every position gets one early and one late chunk. Every chunk has ``e`` tokens
  plus the dealt ones: the ``r`` remainder tokens are dealt one by one round-robin over the positions
  starting at the position after the previous sequence's last dealt token (position 0 for the first
  sequence); a position's first dealt token lengthens its early chunk, a second one its late chunk.
* ``contiguous`` (the plain ring layout): position p holds the p-th of N contiguous blocks of ``S // N``
  tokens, the ``S % N`` remainder dealt round-robin the same way. Causal attention work is unbalanced
  (the last block attends to the whole sequence); no planner chooses it, the worker offers it for
  comparison.
* ``per-sequence`` (WLB-LLM sec. 3.1 / 5.1, "per-sequence sharding", what Plain-4D CP does): the sharded
  sequences are packed, in the microbatch's order, into one buffer of ``T = sum(S)`` tokens and that
  buffer is cut into 2N chunks (the first ``T % 2N`` one token longer), position p taking chunks p and
  2N-1-p. Chunks are large (good kernel efficiency) but a document's late, heavy rows can land on few
  positions (CP imbalance).
* ``per-document`` (WLB-LLM sec. 5.1, padding-free per-document sharding): every document of length
  ``d = 2N*e + r`` is cut into 2N chunks of ``e = d // 2N`` tokens, position p taking chunks p and 2N-1-p;
  the ``r < 2N`` remaining tail tokens are dealt round-robin over the positions, continuing where the
  previous document's remainder stopped. The dealt tokens are laid out contiguously: the tail is cut into
  ``min(r, N)`` consecutive pieces, piece k (of ``r // N + 1`` tokens for ``k < r % N``, else ``r // N``)
  going to position ``(start + k) mod N``; the count each position gets equals dealing the tokens one by
  one.

``position_ranges(mode, lengths, N, p)`` returns, for every sequence of ``lengths`` (microbatch order), the
``[start, end)`` token ranges position p holds, ascending, adjacent ranges merged, empty ones omitted;
over all positions they cover each sequence exactly once. It costs O(len(lengths)) whatever N is, so a
rank view of a group of 16,384 GPUs costs what one of 8 does. A sequence shorter than 2N tokens leaves
some positions empty.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from skrull.solver.errors import RequestError

Ranges = tuple[tuple[int, int], ...]

DEFAULT_SHARDING = "zigzag"
#: Every mode a plan, a worker view or the worker may name.
SHARDING_MODES: tuple[str, ...] = ("zigzag", "per-sequence", "per-document", "contiguous")


def chunks(num_tokens: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous chunks ``[start, end)`` in order, the first ``num_tokens % parts`` one token
    longer (the per-sequence mode's cut of the packed buffer)."""
    return [_chunk(num_tokens, parts, k) for k in range(parts)]


def _chunk(num_tokens: int, parts: int, k: int) -> tuple[int, int]:
    """Chunk ``k`` of ``chunks(num_tokens, parts)`` in O(1)."""
    base, extra = divmod(num_tokens, parts)
    start = k * base + min(k, extra)
    return start, start + base + (1 if k < extra else 0)


def _check_position(group_size: int, position: int) -> None:
    if group_size < 1:
        raise ValueError(f"a group needs at least one GPU, not {group_size}")
    if not 0 <= position < group_size:
        raise ValueError(f"position {position} outside a group of {group_size}")


# -- round-robin dealing: the one rule behind every mode's remainders ---------------------------------


def _in_window(end: int, start: int, width: int, n: int) -> int:
    """How many positions q in ``[0, end)`` lie in the cyclic window ``start, start+1, ..., start+width-1``
    (mod n), for ``0 <= width <= n``."""
    stop = start + width
    if stop <= n:
        return max(0, min(end, stop) - start)
    return max(0, end - start) + min(end, stop - n)


def dealt(position: int, *, start: int, count: int, group_size: int) -> int:
    """Tokens position ``position`` receives when ``count`` tokens are dealt one by one round-robin over
    ``group_size`` positions, the first to position ``start``."""
    full, rest = divmod(count, group_size)
    return full + (1 if (position - start) % group_size < rest else 0)


def _dealt_before(end: int, *, start: int, count: int, group_size: int) -> int:
    """``sum(dealt(q) for q in range(end))`` in O(1)."""
    full, rest = divmod(count, group_size)
    return full * end + _in_window(end, start, rest, group_size)


def _merge(ranges: Sequence[tuple[int, int]]) -> Ranges:
    out: list[tuple[int, int]] = []
    for start, end in sorted(r for r in ranges if r[1] > r[0]):
        if out and out[-1][1] == start:
            out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return tuple(out)


# -- one sequence, one position --------------------------------------------------------------------


def zigzag_ranges(num_tokens: int, group_size: int, position: int, *, deal: int = 0) -> Ranges:
    """Chunks p and 2N-1-p of a sequence whose remainder is dealt from position ``deal`` (module doc)."""
    _check_position(group_size, position)
    n, p = group_size, position
    e, r = divmod(num_tokens, 2 * n)
    # Positions with at least one dealt token: all when r >= n, else a window of r; with two: a window of r - n.
    ones, twos = (n, r - n) if r >= n else (r, 0)

    def ones_before(end: int) -> int:
        return end if ones == n else _in_window(end, deal, ones, n)

    def twos_before(end: int) -> int:
        return _in_window(end, deal, twos, n)

    x = dealt(p, start=deal, count=r, group_size=n)
    front_start = p * e + ones_before(p)
    front = (front_start, front_start + e + min(x, 1))
    early_total = n * e + ones_before(n)
    # late chunks lie in the order of positions n-1, ..., 0
    back_start = early_total + (n - 1 - p) * e + twos_before(n) - twos_before(p + 1)
    back = (back_start, back_start + e + max(x - 1, 0))
    return _merge((front, back))


def contiguous_ranges(num_tokens: int, group_size: int, position: int, *, deal: int = 0) -> Ranges:
    """Block p of N contiguous blocks, the ``S % N`` remainder dealt from position ``deal``."""
    _check_position(group_size, position)
    base, r = divmod(num_tokens, group_size)
    start = position * base + _dealt_before(position, start=deal, count=r, group_size=group_size)
    end = start + base + dealt(position, start=deal, count=r, group_size=group_size)
    return ((start, end),) if end > start else ()


def _per_document_ranges(num_tokens: int, group_size: int, position: int, *, deal: int) -> Ranges:
    n, p = group_size, position
    e, r = divmod(num_tokens, 2 * n)
    pieces = [(p * e, (p + 1) * e), ((2 * n - 1 - p) * e, (2 * n - p) * e)]
    base, extra = divmod(r, n)
    k = (p - deal) % n
    if k < min(r, n):
        start = 2 * n * e + k * base + min(k, extra)
        pieces.append((start, start + base + (1 if k < extra else 0)))
    return _merge(pieces)


#: How far each mode moves the deal after a sequence of S tokens over N positions.
def _remainder(mode: str, num_tokens: int, group_size: int) -> int:
    return num_tokens % (group_size if mode == "contiguous" else 2 * group_size)


_SEQUENCE_CUTS: dict[str, Callable[..., Ranges]] = {
    "zigzag": zigzag_ranges,
    "contiguous": contiguous_ranges,
    "per-document": _per_document_ranges,
}


def _check_mode(mode: str) -> None:
    if mode not in SHARDING_MODES:
        raise ValueError(f"unknown sharding mode {mode!r}; known: {', '.join(SHARDING_MODES)}")


# -- the microbatch: one position, every position, token counts ------------------------------------


def position_ranges(mode: str, lengths: Sequence[int], group_size: int, position: int) -> tuple[Ranges, ...]:
    """The ranges position ``position`` holds of every sequence of ``lengths`` (microbatch order) under
    ``mode``; O(len(lengths)), independent of the group size."""
    _check_mode(mode)
    _check_position(group_size, position)
    n = group_size
    if mode == "per-sequence":
        total = sum(lengths)
        held = (_chunk(total, 2 * n, position), _chunk(total, 2 * n, 2 * n - 1 - position))
        out = []
        offset = 0
        for s in lengths:
            pieces = [(max(a, offset) - offset, min(b, offset + s) - offset) for a, b in held]
            out.append(_merge(pieces))
            offset += s
        return tuple(out)
    cut = _SEQUENCE_CUTS[mode]
    result = []
    deal = 0
    for s in lengths:
        result.append(cut(s, n, position, deal=deal))
        deal = (deal + _remainder(mode, s, n)) % n
    return tuple(result)


def group_ranges(mode: str, lengths: Sequence[int], group_size: int) -> list[tuple[Ranges, ...]]:
    """``ranges[k][p]``: ``position_ranges`` of every position, indexed by sequence then position."""
    by_position = [position_ranges(mode, lengths, group_size, p) for p in range(group_size)]
    return [tuple(by_position[p][k] for p in range(group_size)) for k in range(len(lengths))]


def layout(mode: str, lengths: Sequence[int], group_size: int) -> list[list[Ranges]]:
    """``group_ranges`` as lists (for callers that index and compare lists)."""
    return [list(per_position) for per_position in group_ranges(mode, lengths, group_size)]


def per_sequence_layout(lengths: Sequence[int], group_size: int) -> list[list[Ranges]]:
    """WLB-LLM's per-sequence sharding: the packed buffer of all sequences, cut zigzag."""
    return layout("per-sequence", lengths, group_size)


def per_document_layout(lengths: Sequence[int], group_size: int) -> list[list[Ranges]]:
    """WLB-LLM's padding-free per-document sharding (sec. 5.1): 2N equal chunks, remainder round-robin."""
    return layout("per-document", lengths, group_size)


def position_token_counts(mode: str, lengths: Sequence[int], group_size: int) -> tuple[int, ...]:
    """The real number of tokens each position holds of the sequences ``lengths`` under ``mode``; O(N +
    len(lengths)). Every mode gives ``floor(T / N)`` or ``ceil(T / N)`` of ``T = sum(lengths)``."""
    _check_mode(mode)
    n = group_size
    _check_position(n, 0)
    if mode == "per-sequence":
        total = sum(lengths)
        return tuple(
            sum(b - a for a, b in (_chunk(total, 2 * n, p), _chunk(total, 2 * n, 2 * n - 1 - p))) for p in range(n)
        )
    base = 0
    dealt_total = 0
    for s in lengths:
        r = _remainder(mode, s, n)
        base += (s - r) // n
        dealt_total += r
    # dealt(p, start=0, count=dealt_total): every position ``full``, the first ``rest`` one more
    full, rest = divmod(dealt_total, n)
    return (base + full + 1,) * rest + (base + full,) * (n - rest)


def max_position_tokens(sharded_tokens: int, group_size: int) -> int:
    """The most tokens any position holds when ``sharded_tokens`` are sharded over ``group_size`` GPUs in
    one microbatch, in every mode: ``ceil(T / N)`` (module doc, "Bucket-exact")."""
    return -(-sharded_tokens // group_size)


def read_sharding(value: Any, field: str) -> str:
    """A plan's or a view's ``sharding`` field: one of ``SHARDING_MODES``."""
    if value not in SHARDING_MODES:
        raise RequestError(field, value, f"must be one of {', '.join(SHARDING_MODES)}")
    return str(value)

"""How a sharded sequence's attention is computed: the request's ``cp_modes`` and a microbatch's ``mode``
(docs/formats.md).

* ``allgather`` (DACP, Skrull eqs. 1-7): every GPU of the group gathers the group's K/V; each GPU moves
  about ``T`` sharded tokens' K/V, priced ``T_comm(T)``.
* ``ulysses`` (DeepSpeed-Ulysses, XTuner sequence parallelism): two all-to-alls around attention trade
  the sequence split for a head split, so each GPU sends and receives about ``T / N`` tokens' activations,
  priced ``T_a2a(T) = comm_a2a.ms_per_mib * (T/N) * comm_a2a.bytes_per_token / 2^20 + comm_a2a.fixed_ms``.
  The group size N must divide ``heads.attention``; where N does not divide the K/V heads they go out
  replicated to ``lcm(kv, N)`` heads, ``lcm(kv, N) / N`` per GPU (``kv_heads_per_gpu``), and a profile
  with ``comm_a2a.kv_bytes_per_token`` is charged for the copies (solver/cost.py).

Memory: the bucket (tokens per GPU) counts what every layer keeps for backward, the same in both modes.
During attention an all-gather GPU holds the whole group's K/V (``T * 2 * kv * head_dim``), a Ulysses GPU
the whole sequence for its ``attention/N`` query heads and ``lcm(kv, N)/N <= kv`` K/V heads
(``T * head_dim * (attention/N + 2*lcm(kv, N)/N)``), whose K/V part is never larger than the all-gather
buffer and whose query part equals the query shard it replaces. So the all-to-all buffers fit wherever the
all-gather ones do. What differs is what is kept from forward to backward: an all-gather GPU keeps the
gathered K/V of the whole sharded sequences (worker/dacp.py), which ``CostModel.fits`` charges where the
profile gives ``memory.kv_bytes_per_token`` (CONTRACT.md), a Ulysses GPU keeps only its own tokens.
"""

from __future__ import annotations

import math
from typing import Any

from skrull.solver.errors import RequestError

ALLGATHER = "allgather"
ULYSSES = "ulysses"
#: Every mode, in the order ties are broken (the first of equally cheap modes wins).
CP_MODES: tuple[str, ...] = (ALLGATHER, ULYSSES)
DEFAULT_CP_MODE = ALLGATHER
DEFAULT_CP_MODES: tuple[str, ...] = (ALLGATHER,)


def read_cp_modes(value: Any, field: str = "cp_modes") -> tuple[str, ...]:
    """The request's ``cp_modes``: a non-empty list of distinct known modes, returned in ``CP_MODES`` order
    (so two requests listing the same modes plan the same)."""
    if value is None:
        return DEFAULT_CP_MODES
    if not isinstance(value, list) or not value:
        raise RequestError(field, value, f"must be a non-empty list of modes from {', '.join(CP_MODES)}")
    for k, mode in enumerate(value):
        if not isinstance(mode, str) or mode not in CP_MODES:
            raise RequestError(f"{field}[{k}]", mode, f"must be one of {', '.join(CP_MODES)}")
    if len(set(value)) != len(value):
        raise RequestError(field, value, "lists a mode twice")
    return tuple(m for m in CP_MODES if m in value)


def read_mode(value: Any, field: str = "mode") -> str:
    """A microbatch's ``mode`` (left out: ``allgather``)."""
    if value is None:
        return DEFAULT_CP_MODE
    if not isinstance(value, str) or value not in CP_MODES:
        raise RequestError(field, value, f"must be one of {', '.join(CP_MODES)}")
    return value


def ulysses_divides(attention_heads: int, group_size: int) -> bool:
    """Ulysses splits the attention heads evenly over the group: N must divide them."""
    return group_size >= 1 and attention_heads % group_size == 0


def kv_heads_per_gpu(kv_heads: int, group_size: int) -> int:
    """K/V heads a GPU holds under Ulysses: ``lcm(kv, N) / N``, the K/V heads its query heads read (``kv /
    N`` when N divides them; otherwise the heads go out replicated to ``lcm(kv, N)``, worker/dacp.py
    ``ulysses_kv_copies``). Never more than ``kv``: the all-gather buffer holds all of them."""
    return math.lcm(kv_heads, group_size) // group_size

"""WLB-LLM's fixed-length packing baselines (sec. 3.2, compared in Table 2).

Documents of one or more global batches are packed into M sequences of at most S tokens each (the
context window), balancing the attention workload, proportional to ``sum d_i^2`` for causal masks:

* ``original_packing``: the loader's packing, documents in order, a new sequence when the next one
  would overflow S (WLB-LLM "Original Packing" / Plain-4D);
* ``fixed_length_greedy``: documents in descending ``d^2``, each into the sequence with the least
  attention workload that still has room (WLB-LLM "Fixed-Len Greedy", what Fixed-4D runs);
* ``fixed_length_ilp``: eq. (1), ``min max_j sum_i x_ij d_i^2`` s.t. every document in one sequence and
  ``sum_i x_ij d_i <= S``, solved by OR-Tools CP-SAT (WLB-LLM "Fixed-Len Solver"; the paper used a
  commercial solver and reports over 25 s per batch when packing 4 global batches).

They return lists of positions into the given lengths; evaluating them is up to the caller.
"""

from __future__ import annotations

from collections.abc import Sequence

from skrull.solver.planners.minmax_ilp import solve_minmax_pack


def original_packing(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Loader order, a new sequence whenever the next document would overflow ``max_tokens``."""
    packs: list[list[int]] = []
    tokens = max_tokens + 1
    for k, s in enumerate(lengths):
        if tokens + s > max_tokens:
            packs.append([])
            tokens = 0
        packs[-1].append(k)
        tokens += s
    return packs


def fixed_length_greedy(lengths: Sequence[int], num_sequences: int, max_tokens: int) -> list[list[int]] | None:
    """Descending ``d^2`` into the least-loaded sequence with room; None if some document fits nowhere."""
    loads = [0] * num_sequences
    tokens = [0] * num_sequences
    packs: list[list[int]] = [[] for _ in range(num_sequences)]
    for k in sorted(range(len(lengths)), key=lambda k: (-lengths[k], k)):
        s = lengths[k]
        fits = [j for j in range(num_sequences) if tokens[j] + s <= max_tokens]
        if not fits:
            return None
        j = min(fits, key=lambda j: (loads[j], j))
        packs[j].append(k)
        loads[j] += s * s
        tokens[j] += s
    return packs


def fixed_length_ilp(
    lengths: Sequence[int], num_sequences: int, max_tokens: int, *, time_limit_s: float, seed: int = 0
) -> tuple[list[list[int]] | None, str, float | None]:
    """Eq. (1) by CP-SAT (one worker, fixed seed): (packing or None, status name, proven bound on the
    max ``sum d^2``)."""
    greedy = fixed_length_greedy(lengths, num_sequences, max_tokens)
    hint = None
    if greedy is not None:  # a complete warm start
        hint = [0] * len(lengths)
        for j, pack in enumerate(greedy):
            for k in pack:
                hint[k] = j
    where, name, bound = solve_minmax_pack(
        [s * s for s in lengths], lengths, num_sequences, max_tokens, hint=hint, time_limit_s=time_limit_s, seed=seed
    )
    if where is None:
        return None, name, None
    packs: list[list[int]] = [[] for _ in range(num_sequences)]
    for k, j in enumerate(where):
        packs[j].append(k)
    return packs, name, bound

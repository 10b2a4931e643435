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
    from ortools.sat.python import cp_model

    n = len(lengths)
    m = num_sequences
    weights = [s * s for s in lengths]
    model = cp_model.CpModel()
    x = [[model.new_bool_var(f"x{k}_{j}") for j in range(m)] for k in range(n)]
    top = model.new_int_var(0, sum(weights), "max_attention")
    loads = []
    for j in range(m):
        model.add(sum(lengths[k] * x[k][j] for k in range(n)) <= max_tokens)
        load = model.new_int_var(0, sum(weights), f"load{j}")
        model.add(load == sum(weights[k] * x[k][j] for k in range(n)))
        model.add(top >= load)
        loads.append(load)
    for k in range(n):
        model.add_exactly_one(x[k])
    for j in range(m - 1):
        model.add(loads[j] >= loads[j + 1])
    model.minimize(top)
    greedy = fixed_length_greedy(lengths, m, max_tokens)
    if greedy is not None:  # a complete warm start: assignment, loads and objective
        order = sorted(range(m), key=lambda j: (-sum(weights[k] for k in greedy[j]), j))
        where = {k: pos for pos, j in enumerate(order) for k in greedy[j]}
        for k in range(n):
            for j in range(m):
                model.add_hint(x[k][j], where[k] == j)
        hinted = [sum(weights[k] for k in greedy[j]) for j in order]
        for j in range(m):
            model.add_hint(loads[j], hinted[j])
        model.add_hint(top, max(hinted))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = seed
    solver.parameters.max_time_in_seconds = time_limit_s
    status = solver.solve(model)
    name = solver.status_name(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, name, None
    packs: list[list[int]] = [[] for _ in range(m)]
    for k in range(n):
        packs[next(j for j in range(m) if solver.value(x[k][j]))].append(k)
    return packs, name, solver.best_objective_bound

"""The one Protocol every planner implements (with the shape of its budget needs, ``Cost``), and helpers
shared by the per-iteration planners."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from skrull.solver.plan import MicrobatchSpec, Parallel, Problem
from skrull.solver.sharding import DEFAULT_SHARDING

#: Seeds of per-iteration random streams are ``seed * SEED_STRIDE + iteration``: a prime above any
#: iteration count a request may hold, so no two (seed, iteration) pairs share a stream.
SEED_STRIDE = 1_000_003
#: Estimates closer than this (ms) count as a tie, so float noise never decides between candidates.
TIE_MS = 1e-9
#: A plan within this relative distance of a proven lower bound is reported ``optimal``.
OPTIMAL_TOLERANCE = 1e-4


def iteration_seed(seed: int, iteration: int) -> int:
    """The seed of iteration ``iteration``'s random stream under the request's ``seed``."""
    return seed * SEED_STRIDE + iteration


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannerOutput:
    """A planner's answer: microbatches per iteration (one entry per batch), ids deferred past the last.

    ``status`` and ``bound_ms`` feed the plan's ``solve`` block: heuristics report ``heuristic`` and no
    bound; exact planners report ``optimal`` / ``feasible`` / ``timeout`` with a bound valid for every
    layout (``bound_ms``) and their solver's bound over the plans their model expresses
    (``model_bound_ms``, which ``optimal`` refers to).
    ``stats`` are planner-specific figures carried into ``solve.stats`` (``(name, value)`` pairs).
    """

    iterations: tuple[tuple[MicrobatchSpec, ...], ...]
    pending: tuple[int, ...] = ()
    status: str = "heuristic"
    bound_ms: float | None = None
    model_bound_ms: float | None = None
    stats: tuple[tuple[str, float], ...] = ()


#: Estimating and validating a plan, per sequence (measured 1.2 us on one core): part of every planner's need.
FINISH_PER_SEQUENCE_S = 1.2e-6


@dataclass(frozen=True, slots=True)
class Cost:
    """A planner's measured raw cost of its unavoidable work (``Planner.budget``; the rule that turns it into
    the smallest budget and a request's default is ``solver.budget``), for K sequences in B batches of K_b
    over dp x cp GPUs::

        fixed_s + per_sequence_s * K + per_square_s * sum_b K_b^2 + per_rank_square_s * sum_b (K_b / dp)^2
                + per_rank_cube_s * sum_b (K_b / dp)^3 + per_split_s * sum_b K_b^2 / dp
                + per_slot_s * K * cp + per_gpu_s * K * dp * cp
                + per_dp_rank_s * B * dp + FINISH_PER_SEQUENCE_S * K

    (the shapes each planner's work was measured to follow: bench/budget_estimates.py)."""

    fixed_s: float
    per_sequence_s: float
    per_square_s: float = 0.0
    per_rank_square_s: float = 0.0
    per_rank_cube_s: float = 0.0
    per_split_s: float = 0.0
    per_slot_s: float = 0.0
    per_gpu_s: float = 0.0
    per_dp_rank_s: float = 0.0

    def seconds(self, batch_sizes: Sequence[int], parallel: Parallel | None = None) -> float:
        """The raw estimate (above); without ``parallel``, one GPU."""
        dp, cp = (parallel.dp, parallel.cp) if parallel is not None else (1, 1)
        num = sum(batch_sizes)
        return (
            self.fixed_s
            + self.per_sequence_s * num
            + self.per_square_s * sum(b * b for b in batch_sizes)
            + self.per_rank_square_s * sum((b / dp) ** 2 for b in batch_sizes)
            + self.per_rank_cube_s * sum((b / dp) ** 3 for b in batch_sizes)
            + self.per_split_s * sum(b * b for b in batch_sizes) / dp
            + self.per_slot_s * num * cp
            + self.per_gpu_s * num * dp * cp
            + self.per_dp_rank_s * len(batch_sizes) * dp
            + FINISH_PER_SEQUENCE_S * num
        )


class Planner(Protocol):
    """Turns a problem into microbatch placements. Must never place more than a bucket holds.

    ``streams_iterations``: the planner's plan of batch k depends on batch k alone (not on the other
    batches, their count, the iteration index or the time budget's split), so a multi-batch request may
    be solved one batch at a time (``solver.planning.solve_batch``) and each iteration published as
    soon as it is solved, with no change to the plan's meaning. The planner declares it; no setting can.

    ``budget``: the measured raw cost of its unavoidable work (``Cost``), from which ``solver.budget`` derives
    the smallest ``time_budget_s`` it keeps and a request's default; None (a plug-in that declares none,
    ``registry.register``): no floor, the default budget.
    """

    name: str
    streams_iterations: bool

    @property
    def budget(self) -> Cost | None: ...

    def plan(self, problem: Problem) -> PlannerOutput: ...


def plan_each_iteration(
    problem: Problem, plan_batch: Callable[[Problem, int, tuple[int, ...]], Sequence[MicrobatchSpec]]
) -> PlannerOutput:
    """Run ``plan_batch(problem, iteration_index, ids)`` for every batch independently."""
    return PlannerOutput(
        iterations=tuple(tuple(plan_batch(problem, index, ids)) for index, ids in enumerate(problem.batch_ids))
    )


def make_spec(
    *,
    step: int,
    ranks: tuple[int, ...],
    local: Sequence[Sequence[int]],
    sharded: Sequence[int],
    sharding: str = DEFAULT_SHARDING,
) -> MicrobatchSpec:
    """Build a microbatch; on a one-GPU group "sharded" means "whole on that GPU" (no communication).

    ``sharding`` (how sharded sequences are cut, ``solver.types.SHARDING_MODES``) only matters when
    something is sharded; otherwise the default is recorded.
    """
    local_t = tuple(tuple(sorted(ids)) for ids in local)
    if len(ranks) == 1 and sharded:
        local_t = (tuple(sorted(local_t[0] + tuple(sharded))),)
        sharded = ()
    if not sharded:
        sharding = DEFAULT_SHARDING
    return MicrobatchSpec(step=step, ranks=ranks, local=local_t, sharded=tuple(sorted(sharded)), sharding=sharding)


def all_sharded(*, step: int, ranks: tuple[int, ...], ids: Sequence[int]) -> MicrobatchSpec:
    """A microbatch whose every sequence is split over the whole group (plain context parallelism)."""
    return make_spec(step=step, ranks=ranks, local=[() for _ in ranks], sharded=ids)


def contiguous_shares(ids: Sequence[int], parts: int) -> list[list[int]]:
    """Split ``ids`` in order into ``parts`` contiguous shares whose sizes differ by at most one
    (the first ``len % parts`` shares get one more), as a distributed sampler hands out a batch."""
    base, extra = divmod(len(ids), parts)
    out: list[list[int]] = []
    start = 0
    for r in range(parts):
        size = base + (1 if r < extra else 0)
        out.append(list(ids[start : start + size]))
        start += size
    return out

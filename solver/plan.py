"""The layout, the problem a planner sees and the plan it answers, as frozen values (docs/formats.md, "Plan").

Plans name GPUs by logical rank (``g = dp_rank * cp + cp_rank`` in the static layout) and sequences by
global id (the index over the concatenation of all batches), so a plan serializes, compares and tests
on a CPU with no process group around.

The planners, the cost model and the search import these; the request (``solver.types.Request``), which
resolves its planner's default budget through the registry, sits above them, and ``solver.types`` gives
every name here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Literal

from skrull.solver.cp_modes import DEFAULT_CP_MODE, DEFAULT_CP_MODES
from skrull.solver.profile import Profile

# How a microbatch's sharded sequences are cut over its group: one vocabulary, ``solver.sharding``.
from skrull.solver.sharding import DEFAULT_SHARDING as DEFAULT_SHARDING
from skrull.solver.sharding import SHARDING_MODES as SHARDING_MODES

if TYPE_CHECKING:  # a problem is built from a request; the request module imports this one
    from skrull.solver.types import Request

PLAN_SCHEMA = "skrull.plan/v1"
SolveStatus = Literal["heuristic", "optimal", "feasible", "timeout"]
SOLVE_STATUSES: tuple[str, ...] = ("heuristic", "optimal", "feasible", "timeout")


def layout_fields(sharding: str, mode: str) -> dict[str, str]:
    """A microbatch's ``sharding`` and ``mode`` as plan and rank-view documents write them: each only where it
    is not the default (``DEFAULT_SHARDING``, ``DEFAULT_CP_MODE``), so a plan in the default layout is the
    contract's plain form (docs/formats.md) and readers of that form need not know the fields."""
    pairs = (("sharding", sharding, DEFAULT_SHARDING), ("mode", mode, DEFAULT_CP_MODE))
    return {key: value for key, value, default in pairs if value != default}


@dataclass(frozen=True, slots=True, kw_only=True)
class Parallel:
    """DP x CP layout: ``dp * cp`` GPUs; DP rank ``i`` owns GPUs ``i*cp .. i*cp+cp-1`` (its CP group)."""

    dp: int
    cp: int

    @property
    def num_gpus(self) -> int:
        return self.dp * self.cp

    def cp_group(self, dp_rank: int) -> tuple[int, ...]:
        """Global ranks of DP rank ``dp_rank``'s CP group."""
        return tuple(range(dp_rank * self.cp, (dp_rank + 1) * self.cp))


@dataclass(frozen=True, slots=True, kw_only=True)
class Problem:
    """What a planner sees: every sequence's length by global id, and which ids each batch holds."""

    lengths: tuple[int, ...]
    batch_ids: tuple[tuple[int, ...], ...]
    parallel: Parallel
    profile: Profile
    bucket_tokens: int
    time_budget_s: float = 1.0
    seed: int = 0
    backend: str | None = None
    deterministic: bool = False
    cp_modes: tuple[str, ...] = DEFAULT_CP_MODES

    @classmethod
    def from_request(cls, request: Request) -> Problem:
        lengths: list[int] = []
        batch_ids: list[tuple[int, ...]] = []
        for batch in request.batches:
            start = len(lengths)
            lengths.extend(batch)
            batch_ids.append(tuple(range(start, len(lengths))))
        return cls(
            lengths=tuple(lengths),
            batch_ids=tuple(batch_ids),
            parallel=request.parallel,
            profile=request.profile,
            bucket_tokens=request.bucket_tokens,
            time_budget_s=request.resolved_time_budget_s,
            seed=request.seed,
            backend=request.backend,
            deterministic=request.deterministic,
            cp_modes=request.cp_modes,
        )

    @property
    def group_capacity_tokens(self) -> int:
        """Tokens one CP group holds in one microbatch: ``cp * bucket_tokens`` (Skrull eq. 10)."""
        return self.parallel.cp * self.bucket_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where one microbatch's sequences go: ``local[j]`` stays whole on ``ranks[j]``; ``sharded`` is split
    over all of ``ranks`` (cut as ``sharding`` says), its attention computed in ``mode`` (solver/cp_modes.py).
    What a planner's ``MicrobatchSpec`` and a plan's ``Microbatch`` share."""

    step: int
    ranks: tuple[int, ...]
    local: tuple[tuple[int, ...], ...]
    sharded: tuple[int, ...]
    sharding: str = DEFAULT_SHARDING
    mode: str = DEFAULT_CP_MODE

    @property
    def seq_ids(self) -> tuple[int, ...]:
        return tuple(chain.from_iterable(self.local)) + self.sharded


@dataclass(frozen=True, slots=True, kw_only=True)
class MicrobatchSpec(Placement):
    """A planner's placement of one microbatch, before estimating its time.

    ``local[j]`` stays whole on ``ranks[j]``; ``sharded`` is split evenly over all of ``ranks``, its
    attention computed in ``mode`` (solver/cp_modes.py).
    """


@dataclass(frozen=True, slots=True, kw_only=True)
class Microbatch(Placement):
    """A microbatch of a plan: its placement and its estimated time (``estimated_ms``, the cost model's)."""

    estimated_ms: float
    #: the link its group used (``intra_node`` / ``inter_node``) when the profile has a ``topology``; None without
    link: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Iteration:
    """One global batch's microbatches. ``lower_bound_ms``: no plan of these sequences, with any groups,
    beats it; ``static_bound_ms``: no plan in Skrull's static layout (groups of one CP group) beats it,
    a plan with wider groups may (None when not given, e.g. a plan written elsewhere)."""

    index: int
    microbatches: tuple[Microbatch, ...]
    estimated_ms: float
    lower_bound_ms: float
    static_bound_ms: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SolveInfo:
    """How the plan was found. ``gap = (objective - bound) / objective`` when a bound is known.

    ``bound_ms`` holds for every layout: no plan of the request, with any groups, is faster.
    ``model_bound_ms`` (exact planners only) is the solver's bound over the plans its model can express
    (``ilp``: Skrull's static layout; ``ilp-flex``: its family of groups), and ``model_gap`` the gap to
    it; ``status: optimal`` is proven against it, so a plan with other groups may beat it.

    ``stats`` are planner-specific figures as ``(name, value)`` pairs (e.g. WLB-LLM's average delay in
    iterations); empty for most planners.
    """

    wall_ms: float
    status: str
    objective_ms: float
    bound_ms: float | None = None
    gap: float | None = None
    model_bound_ms: float | None = None
    model_gap: float | None = None
    stats: tuple[tuple[str, float], ...] = ()

    @property
    def stats_dict(self) -> dict[str, float]:
        return dict(self.stats)


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    solver: str
    parallel: Parallel
    bucket_tokens: int
    iterations: tuple[Iteration, ...]
    pending: tuple[int, ...]
    solve: SolveInfo
    schema: str = PLAN_SCHEMA

    @property
    def estimated_ms(self) -> float:
        """Total estimated time over all iterations."""
        return sum(it.estimated_ms for it in self.iterations)

    @property
    def lower_bound_ms(self) -> float:
        return sum(it.lower_bound_ms for it in self.iterations)

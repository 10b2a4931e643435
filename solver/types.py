"""Requests as frozen values (docs/formats.md, "Request"), and every type of ``solver.plan`` (the layout,
the problem, the plan) under the names users import.

A request's missing ``time_budget_s`` is resolved once, when the request is built (read or constructed):
its planner's default for its size (``solver.budget.default_budget_s``, which reads the planner's declared
needs from the registry), what ``resolved_time_budget_s`` answers. The planners import ``solver.plan``,
never this module, so the rule reads one way: request -> budget -> registry -> planners -> plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from skrull.solver.budget import default_budget_s
from skrull.solver.cp_modes import DEFAULT_CP_MODES, read_cp_modes
from skrull.solver.plan import DEFAULT_SHARDING as DEFAULT_SHARDING
from skrull.solver.plan import PLAN_SCHEMA as PLAN_SCHEMA
from skrull.solver.plan import SHARDING_MODES as SHARDING_MODES
from skrull.solver.plan import SOLVE_STATUSES as SOLVE_STATUSES
from skrull.solver.plan import Iteration as Iteration
from skrull.solver.plan import Microbatch as Microbatch
from skrull.solver.plan import MicrobatchSpec as MicrobatchSpec
from skrull.solver.plan import Parallel as Parallel
from skrull.solver.plan import Plan as Plan
from skrull.solver.plan import Problem as Problem
from skrull.solver.plan import SolveInfo as SolveInfo
from skrull.solver.plan import SolveStatus as SolveStatus
from skrull.solver.profile import Profile


@dataclass(frozen=True, slots=True, kw_only=True)
class Defer:
    """What ``auto`` may defer (solver/defer.py): up to ``max_sequences`` sequences of each batch wait,
    into a later batch of the request or into the plan's ``pending`` (for the next request), at most
    ``max_wait`` iterations (pending from batch b waits ``len(batches) - b``: it runs first in the next
    request). The first ``carried`` sequences of the first batch are ones an earlier request deferred: they
    run in iteration 0, never wait again. ``auto``'s own per-batch choice waits one iteration; a longer
    ``max_wait`` lets it keep a whole-request plan that waits longer (WLB-LLM's outlier queues)."""

    max_sequences: int
    carried: int = 0
    max_wait: int = 1


def defers(max_sequences: int | None) -> bool:
    """Whether a ``defer`` of ``max_sequences`` (None: no ``defer``) lets sequences wait: ``auto`` then plans
    batch by batch, and its budget is the sum of each batch's need (``solver.budget``). The one rule the
    request, the service's up-front check and the loader's adaptive budget share."""
    return max_sequences is not None and max_sequences > 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """A planning request: the lengths of one or more global batches, a layout and a profile.

    ``time_budget_s=None``: the planner's default for a request this size (``solver.budget.default_budget_s``),
    resolved once when the request is built and answered by ``resolved_time_budget_s``; ``time_budget_s``
    stays None, so the request writes back as it was read.
    """

    batches: tuple[tuple[int, ...], ...]
    parallel: Parallel
    profile: Profile
    solver: str = "auto"
    time_budget_s: float | None = None
    bucket_tokens_override: int | None = None
    backend: str | None = None
    seed: int = 0
    deterministic: bool = False
    #: every GPU of the world runs the same number of microbatches in every iteration (solver/equalize.py)
    equal_microbatches: bool = False
    #: ``auto`` may defer sequences by one iteration (None: off; solver/defer.py)
    defer: Defer | None = None
    #: how sharded sequences' attention may run (solver/cp_modes.py), in ``CP_MODES`` order
    cp_modes: tuple[str, ...] = DEFAULT_CP_MODES
    #: the planner's default budget for this request, resolved once when it is built (None: it names its own)
    default_time_budget_s: float | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # A Request built in Python gets the reader's check of its modes (a string such as "ulysses" would
        # otherwise be matched by substring), in one order: two requests with the same modes plan the same.
        modes = self.cp_modes
        if modes != DEFAULT_CP_MODES:
            object.__setattr__(self, "cp_modes", read_cp_modes(list(modes) if isinstance(modes, tuple) else modes))
        if self.time_budget_s is None:
            sizes = [len(b) for b in self.batches]
            default = default_budget_s(self.solver, sizes, self.parallel, deferring=self.deferring)
            object.__setattr__(self, "default_time_budget_s", default)

    @property
    def bucket_tokens(self) -> int:
        """The memory bucket in force: the request's override, else the profile's."""
        if self.bucket_tokens_override is not None:
            return self.bucket_tokens_override
        return self.profile.bucket_tokens

    @property
    def num_sequences(self) -> int:
        return sum(len(b) for b in self.batches)

    @property
    def resolved_time_budget_s(self) -> float:
        """The budget in force: the request's own, else its planner's default for its size (resolved when the
        request was built)."""
        if self.time_budget_s is not None:
            return self.time_budget_s
        assert self.default_time_budget_s is not None  # __post_init__ resolved it
        return self.default_time_budget_s

    @property
    def deferring(self) -> bool:
        """Whether sequences may wait (``defer`` with ``max_sequences`` > 0): ``auto`` then plans batch by batch."""
        return defers(None if self.defer is None else self.defer.max_sequences)

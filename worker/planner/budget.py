"""The planning budget: how long each request may plan, derived from the measured step time.

Planning overlaps training, so the budget that costs the loop nothing is a share of the step it hides
behind; and since the budget is part of the request, every rank must ask with the same one to get the same
plan (``PlanningBudget``'s docstring has the formula and how ranks agree; ``unagreed_budget_s`` the budget
when they have nothing to agree through).
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from skrull.solver.budget import smallest_budget_s
from skrull.solver.errors import RequestError
from skrull.solver.types import Parallel

log = logging.getLogger("skrull.planner")

# -- the planning budget ----------------------------------------------------------------------------


def _two_digits(seconds: float) -> float:
    """Two significant digits: budgets read well in the log and differ only when the step really changed."""
    if seconds <= 0:
        return 0.0
    factor = 10.0 ** (1 - math.floor(math.log10(seconds)))
    return round(seconds * factor) / factor


def _two_digits_up(seconds: float) -> float:
    if seconds <= 0:
        return 0.0
    factor = 10.0 ** (1 - math.floor(math.log10(seconds)))
    return math.ceil(seconds * factor) / factor


def unagreed_budget_s(
    solver: str, batch_sizes: Sequence[int], parallel: Parallel, *, deferring: bool = False
) -> float | None:
    """The budget of a request when the ranks have nothing to agree through (no ``torch.distributed`` group,
    ranks given explicitly, several of them, not all asking one planner process): the planner's own minimum
    for the request (``smallest_budget_s``, two significant digits up), a function of the request alone, so
    every rank asks for the same plan. None for a planner without an estimate (the planner's default then)."""
    floor = smallest_budget_s(solver, batch_sizes, parallel, deferring=deferring)
    return _two_digits_up(floor) if floor > 0 else None


class PlanningBudget:
    """``time_budget_s`` of each request, derived from the measured step time so planning keeps up.

    ``budget(chunk) = share * step_s * iterations_per_request / overrun``, two significant digits, at
    least the planner's own minimum for the request (``smallest_budget_s``), at most ``max_s``:

    - ``step_s``: the median period between the loop's ``next()`` calls over the last 16 iterations (the
      whole step: forward, backward, optimizer, and the loader);
    - ``share`` (default 0.5): planning may use half a step of one core per iteration, so it keeps up
      even when its process shares a core with the loop;
    - ``overrun``: the median of ``wall / budget`` of the plans solved so far (at least 1): a planner that
      takes longer than its budget (process start, validation, a slow core) gets less next time;
    - behind: when the loader's prefetch thread had to wait for two of the last four plans, the share is
      quartered until planning is ahead again.

    Before the first steps are measured the budget is ``initial_s`` (small: the first plans get ahead).
    The budget is part of the request,
    so every rank and node must ask with the same one to get the same plan: each loader proposes its
    budget in the job's ``torch.distributed`` store with ``compare_set``, and the first proposal of a request
    is the one every rank uses (``decide``). Without ``torch.distributed`` (ranks given explicitly) the
    ranks agree through the node's planner process when every rank of the job asks it (one torchrun node:
    ``ProcessPlans.serves_whole_job``, ``compare_set``). Ranks that share no planner process (a launcher of
    one's own starts one per rank; nodes each run their own) have nothing to agree through: the loader
    adapts only when it is the job's one rank (DP1 x CP1) and otherwise asks for the planner's minimum for
    each request (``unagreed_budget_s``), which every rank computes alike.
    Decisions are kept (``state_dict``), so a resumed run asks for the
    same plans.
    """

    def __init__(self, *, share: float = 0.5, initial_s: float = 0.02, max_s: float = 10.0) -> None:
        if not 0 < share <= 4:
            raise RequestError("planning_share", share, "must be in (0, 4]")
        self.share, self.initial_s, self.max_s = share, initial_s, max_s
        self._periods: deque[float] = deque(maxlen=16)
        self._overruns: deque[float] = deque(maxlen=16)
        self._solves = 0
        self._waits: deque[float] = deque(maxlen=4)
        #: budgets decided, by request ("epoch/chunk")
        self.decided: dict[str, float] = {}
        self._lock = threading.Lock()

    def record_step(self, seconds: float) -> None:
        with self._lock:
            self._periods.append(seconds)

    def record_solve(self, meta: Mapping[str, Any]) -> None:
        """Learn how the planner keeps its budgets; the first plan (the process warming up) is left out."""
        budget, wall = meta.get("budget_s"), meta.get("wall_s")
        if isinstance(budget, int | float) and budget > 0 and isinstance(wall, int | float):
            with self._lock:
                self._solves += 1
                if self._solves > 1:
                    self._overruns.append(wall / budget)

    def record_wait(self, seconds: float) -> None:
        """How long a prefetch thread waited for a plan to be solved: planning is behind when it waits."""
        with self._lock:
            self._waits.append(seconds)

    @property
    def step_s(self) -> float | None:
        with self._lock:
            return sorted(self._periods)[len(self._periods) // 2] if self._periods else None

    def decide(
        self,
        request: str,
        *,
        solver: str,
        batch_sizes: Sequence[int],
        parallel: Parallel,
        store: Any = None,
        key: str = "",
        deferring: bool = False,
    ) -> float:
        """The budget of ``request`` ("epoch/chunk"): this loader's proposal, or the one already agreed in
        ``store`` (the first proposal of any rank wins: ``compare_set``), so every rank and node asks for the
        same plan."""
        with self._lock:
            if request in self.decided:
                proposal, why = self.decided[request], "kept from before (state_dict)"
            else:
                proposal, why = self._propose(
                    solver=solver, batch_sizes=batch_sizes, parallel=parallel, deferring=deferring
                )
        budget = proposal
        if store is not None:
            agreed = store.compare_set(f"{key}/{request}", "", repr(proposal))
            budget = float(agreed.decode() if isinstance(agreed, bytes) else agreed)
            if budget != proposal:
                why = f"agreed by another rank (this one proposed {proposal:g} s)"
        log.info("planning budget of request %s: %g s (%s)", request, budget, why)
        with self._lock:
            self.decided[request] = budget
        return budget

    def _propose(
        self, *, solver: str, batch_sizes: Sequence[int], parallel: Parallel, deferring: bool = False
    ) -> tuple[float, str]:
        periods, overruns = sorted(self._periods), sorted(self._overruns)
        overrun = max(1.0, overruns[len(overruns) // 2]) if len(overruns) >= 3 else 1.0
        behind = sum(w > 1e-3 for w in self._waits) >= 2  # plans were not ready when asked for: catch up
        share = self.share / 4 if behind else self.share
        if not periods:
            raw, why = self.initial_s, "no step measured yet"
        else:
            step = periods[len(periods) // 2]
            raw = share * step * len(batch_sizes) / overrun
            why = (f"{share:g} x step {step * 1e3:.1f} ms x {len(batch_sizes)} iteration(s)"
                   f" / overrun {overrun:.2f}{'; behind: a quarter of the share' if behind else ''}")  # fmt: skip
        floor = _two_digits_up(smallest_budget_s(solver, batch_sizes, parallel, deferring=deferring))
        budget = min(self.max_s, max(_two_digits(raw), floor))
        if budget != _two_digits(raw):
            why += f"; kept within [{floor:g} s (the planner's minimum), {self.max_s:g} s]"
        return budget, why

    def state_dict(self, *, epoch: int, from_chunk: int) -> dict[str, float]:
        """The budgets decided for the requests not yet trained: ``epoch``'s, from ``from_chunk`` on."""
        with self._lock:
            return {
                r: b
                for r, b in self.decided.items()
                if r.split("/")[0] == str(epoch) and int(r.split("/")[1]) >= from_chunk
            }

    def load_state_dict(self, decided: Mapping[str, Any]) -> None:
        with self._lock:
            for r, b in decided.items():
                self.decided[str(r)] = float(b)

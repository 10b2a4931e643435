"""Constructive starts for ``auto``: every cheap planner of the project, run while the budget allows.

Each start predicts its own planning time as ``scale * (per_sequence_s * K + per_square_s * sum_b K_b^2)``
for K sequences in batches of K_b (``verl-kk``'s Karmarkar-Karp differencing is quadratic in a batch);
``scale`` starts at 1 and follows what this process measures (an exponential average of measured /
predicted), so a loaded or fast machine is learnt after a call or two. A start runs only when its
prediction, plus the time to cost its plan, fits the time left; the starts whose time depends on the
lengths (the peers), and any start predicted to take more than ``ISOLATE_ABOVE_S``, run in a child
process that is killed at the deadline, so a wrong prediction costs that start, never the budget.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from skrull.solver.errors import SkrullError
from skrull.solver.ilp.runner import run_with_deadline
from skrull.solver.planners.base import Planner, PlannerOutput
from skrull.solver.planners.baselines import DeepSpeedPlanner, PackedPlanner, SortedPlanner
from skrull.solver.planners.dynamic_cp import DynamicCpPlanner
from skrull.solver.planners.hydraulis import HydraulisPlanner
from skrull.solver.planners.skrull import RoundRobinPlanner, SkrullPlanner
from skrull.solver.planners.verl_kk import VerlKkPlanner
from skrull.solver.planners.wlb import WlbPlanner
from skrull.solver.search.construct import SpreadStart
from skrull.solver.types import Problem

#: Weight of the newest measurement in a start's time scale.
SCALE_SMOOTHING = 0.5
#: A start predicted to take longer than this runs in a killable child even if it is cheap per sequence
#: (a wrong prediction on a large batch must not break the budget).
ISOLATE_ABOVE_S = 0.05
#: How far past its prediction an isolated start may run (unless half the time left is more).
OVERRUN_FACTOR = 3.0
#: Time ``auto`` spends costing each start's plan (iteration times, work), per sequence.
EVALUATION_PER_SEQUENCE_S = 3e-6


@dataclass(frozen=True, slots=True, kw_only=True)
class Start:
    """A constructive start and its time model (seconds)."""

    name: str
    make: Callable[[], Planner]
    per_sequence_s: float
    per_square_s: float = 0.0
    fixed_s: float = 0.0
    #: Run in a child process killed at the deadline (starts whose time varies with the lengths).
    isolated: bool = False

    def unit_s(self, batch_sizes: Sequence[int]) -> float:
        return (
            self.fixed_s + self.per_sequence_s * sum(batch_sizes) + self.per_square_s * sum(b * b for b in batch_sizes)
        )


#: In order of cost; the peers (flexible layouts: groups wider than CP, heterogeneous replicas,
#: per-sequence sharding, deferral of outliers) last. Priors measured on 256-sequence batches.
STARTS: tuple[Start, ...] = (
    Start(name="packed", make=PackedPlanner, per_sequence_s=1e-6),
    Start(name="spread", make=SpreadStart, per_sequence_s=3e-5),
    Start(name="skrull", make=SkrullPlanner, per_sequence_s=8e-6),
    Start(name="round-robin", make=RoundRobinPlanner, per_sequence_s=8e-6),
    Start(name="verl-kk", make=VerlKkPlanner, per_sequence_s=4e-6, per_square_s=3e-8),
    Start(name="hydraulis", isolated=True, make=HydraulisPlanner, per_sequence_s=1.2e-4, fixed_s=0.005),
    Start(name="wlb", isolated=True, make=WlbPlanner, per_sequence_s=1e-4, fixed_s=0.002),
    Start(name="dynamic-cp", isolated=True, make=DynamicCpPlanner, per_sequence_s=1.2e-4, fixed_s=0.002),
    # the plain-CP baselines: never better than ``packed`` on the bundled distributions, run last
    Start(name="deepspeed", make=DeepSpeedPlanner, per_sequence_s=2e-6),
    Start(name="sorted", make=SortedPlanner, per_sequence_s=4e-6),
)

_scale: dict[str, float] = {}


def predicted_s(start: Start, batch_sizes: Sequence[int]) -> float:
    return _scale.get(start.name, 1.0) * start.unit_s(batch_sizes)


def _learn(start: Start, batch_sizes: Sequence[int], measured_s: float) -> None:
    ratio = measured_s / max(start.unit_s(batch_sizes), 1e-9)
    old = _scale.get(start.name, 1.0)
    _scale[start.name] = (1 - SCALE_SMOOTHING) * old + SCALE_SMOOTHING * ratio


def run_starts(
    problem: Problem,
    *,
    deadline: float,
    keep_s: float,
    names: Sequence[str] | None = None,
    isolate: bool = True,
) -> list[tuple[str, PlannerOutput]]:
    """Outputs of the starts whose predicted time fits before ``deadline - keep_s`` (the cheapest
    always runs). A start that fails (``SkrullError``) is skipped. ``isolate=False`` runs every start
    in process (with an infinite deadline: every start, deterministically)."""
    sizes = [len(ids) for ids in problem.batch_ids]
    out: list[tuple[str, PlannerOutput]] = []
    evaluation_s = EVALUATION_PER_SEQUENCE_S * sum(sizes)
    for start in STARTS:
        if names is not None and start.name not in names:
            continue
        left = deadline - keep_s - time.monotonic() - evaluation_s * (len(out) + 1)
        predicted = predicted_s(start, sizes)
        if out and predicted > left:
            continue
        sub = dataclasses.replace(problem, time_budget_s=max(1e-3, left))
        began = time.monotonic()
        isolated = isolate and bool(out) and (start.isolated or predicted > ISOLATE_ABOVE_S)
        # an isolated start may overrun its prediction threefold, or use half the time left, not all of
        # it: a start that misjudges a batch must leave time for the next
        allowed = min(left, max(OVERRUN_FACTOR * predicted, left / 2)) if isolated else left
        output = _run_isolated(start, sub, time.monotonic() + max(0.0, allowed)) if isolated else _run(start, sub)
        # a start killed at the deadline took longer than measured: learn at least twice that
        _learn(start, sizes, (1 if output is not None else 2) * (time.monotonic() - began))
        if output is not None:
            out.append((start.name, output))
    return out


def _run(start: Start, problem: Problem) -> PlannerOutput | None:
    try:
        return start.make().plan(problem)
    except SkrullError:
        return None


def _run_isolated(start: Start, problem: Problem, deadline: float) -> PlannerOutput | None:
    """``start`` in a forked child, dropped if it has not answered by ``deadline``."""
    outcome = run_with_deadline(lambda _report, _deadline: _run(start, problem), deadline=deadline, grace_s=0.0)
    payload = outcome.payload
    return payload if isinstance(payload, PlannerOutput) else None

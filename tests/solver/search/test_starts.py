"""Start predictions: a start whose solver module this process lacks is predicted with its import (a
forked child would import it again), and the peers run in the order of the smallest budget each accepts."""

from __future__ import annotations

import json

from skrull.solver.planners.baselines import PackedPlanner
from skrull.solver.search import starts
from skrull.solver.search.budget import smallest_budget_s
from skrull.solver.types import Parallel


def test_a_start_with_a_missing_module_is_predicted_with_its_import() -> None:
    sizes = [256]
    cold = starts.Start(name="cold-start", make=PackedPlanner, per_sequence_s=1e-4, imports="no_such_module_here")
    warm = starts.Start(name="warm-start", make=PackedPlanner, per_sequence_s=1e-4, imports=json.__name__)
    assert starts.predicted_s(cold, sizes) == starts.predicted_s(warm, sizes) + starts.IMPORT_S
    assert starts.predicted_s(warm, sizes) == 1e-4 * 256


def test_the_peer_asked_for_at_the_smallest_budget_runs_first() -> None:
    sizes = [256]
    parallel = Parallel(dp=4, cp=8)
    peers = starts.peer_order([s for s in starts.STARTS if s.isolated], sizes, parallel)
    assert [s.name for s in peers] == ["wlb-keep", "wlb", "dynamic-cp", "hydraulis"]
    budgets = [smallest_budget_s(s.name, sizes, parallel) for s in peers]
    assert budgets == sorted(budgets)

"""The one registry of planners, by the names requests use (CONTRACT.md "Solver names")."""

from __future__ import annotations

from collections.abc import Callable

from skrull.solver.errors import UnknownSolverError
from skrull.solver.planners.auto import AutoPlanner
from skrull.solver.planners.base import Planner
from skrull.solver.planners.baselines import DeepSpeedPlanner, PackedPlanner, SortedPlanner
from skrull.solver.planners.dynamic_cp import DynamicCpPlanner
from skrull.solver.planners.exact import IlpPlanner
from skrull.solver.planners.exact_flexible import FlexibleIlpPlanner
from skrull.solver.planners.hydraulis import HydraulisPlanner
from skrull.solver.planners.skrull import RoundRobinPlanner, SkrullPlanner
from skrull.solver.planners.verl_kk import VerlKkPlanner
from skrull.solver.planners.wlb import WlbPlanner

_REGISTRY: dict[str, Callable[[], Planner]] = {
    "skrull": SkrullPlanner,
    "ilp": IlpPlanner,
    "auto": AutoPlanner,
    "ilp-flex": FlexibleIlpPlanner,
    "deepspeed": DeepSpeedPlanner,
    "packed": PackedPlanner,
    "sorted": SortedPlanner,
    "round-robin": RoundRobinPlanner,
    # peers (README "Peers"): each one's decision logic on the reference cost model
    "wlb": WlbPlanner,
    "dynamic-cp": DynamicCpPlanner,
    "hydraulis": HydraulisPlanner,
    "verl-kk": VerlKkPlanner,
}

#: The peer systems' planners (README "Peers"), e.g. for a best-of planner to take ideas from.
PEERS: tuple[str, ...] = ("wlb", "dynamic-cp", "hydraulis", "verl-kk")

#: Planners that place every sequence with plain CP; ``compare`` reports speedups over the first.
BASELINES: tuple[str, ...] = ("deepspeed", "packed", "sorted", "round-robin")


def register(name: str, factory: Callable[[], Planner]) -> None:
    """Add a planner (used by optional planners that need extra packages)."""
    _REGISTRY[name] = factory


def planner_names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def get_planner(name: str) -> Planner:
    factory = _REGISTRY.get(name)
    if factory is None:
        raise UnknownSolverError("solver", name, f"unknown solver; known: {', '.join(_REGISTRY)}")
    return factory()

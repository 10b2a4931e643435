"""The one registry of planners, by the names requests use (docs/planners.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

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
from skrull.solver.planners.xtuner import XtunerPlanner


def solved_whole(factory: Callable[[], Any]) -> Callable[[], Planner]:
    """A planner (a plug-in's) that does not declare ``Planner.streams_iterations``: planned whole, the
    choice that never changes its plan; one that declares no ``Planner.budget``: no measured need (no floor
    on its budget, the default budget)."""

    def make() -> Planner:
        planner = factory()
        if not hasattr(planner, "streams_iterations"):
            planner.streams_iterations = False
        if not hasattr(planner, "budget"):
            planner.budget = None
        return cast(Planner, planner)

    return make


_REGISTRY: dict[str, Callable[[], Planner]] = {
    "skrull": SkrullPlanner,
    "ilp": IlpPlanner,
    "auto": AutoPlanner,
    "ilp-flex": FlexibleIlpPlanner,
    "deepspeed": DeepSpeedPlanner,
    "packed": PackedPlanner,
    "sorted": SortedPlanner,
    "round-robin": RoundRobinPlanner,
    # peers (docs/planners.md "Peers"): each one's decision logic on the reference cost model
    "wlb": WlbPlanner,
    "dynamic-cp": DynamicCpPlanner,
    "hydraulis": HydraulisPlanner,
    "verl-kk": VerlKkPlanner,
    "xtuner": XtunerPlanner,
}

#: The peer systems' planners (docs/planners.md "Peers"), e.g. for a best-of planner to take ideas from.
PEERS: tuple[str, ...] = ("wlb", "dynamic-cp", "hydraulis", "verl-kk", "xtuner")

#: Planners that place every sequence with plain CP; ``compare`` reports speedups over the first.
BASELINES: tuple[str, ...] = ("deepspeed", "packed", "sorted", "round-robin")


def register(name: str, factory: Callable[[], Planner]) -> None:
    """Add a planner (used by optional planners that need extra packages). One that does not declare
    ``streams_iterations`` is planned whole, the choice that can never change its plan."""
    _REGISTRY[name] = solved_whole(factory)


def planner_names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def get_planner(name: str) -> Planner:
    factory = _REGISTRY.get(name)
    if factory is None:
        raise UnknownSolverError("solver", name, f"unknown solver; known: {', '.join(_REGISTRY)}")
    return factory()

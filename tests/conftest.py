"""Shared fixtures: small hand-checkable profiles and request builders; the test tiers (tests/tiers.py)
applied to every collected test."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings

from skrull.solver.io import request_from_dict
from skrull.solver.profile import Profile, profile_from_dict
from skrull.solver.types import Request
from tests import launch
from tests.tiers import tiers_of

T = TypeVar("T")

# Property tests are deterministic (the same examples every run, so CI never fails by chance);
# HYPOTHESIS_PROFILE=explore draws new random examples, to hunt for counterexamples by hand. No per-example
# deadline nor too-slow health check: how long an example takes depends on the machine's load, not on the
# property under test.
UNTIMED = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deterministic", UNTIMED, derandomize=True, database=None)
settings.register_profile("explore", UNTIMED)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))

ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test gets the markers of its tiers (tests/tiers.py), so ``-m "not (torchrun or server or postgres
    or slow)"`` (``make test-fast``) selects the unit tier; ``-m server`` and the like select one tier."""
    for item in items:
        try:
            path = item.path.resolve().relative_to(ROOT).as_posix()
        except ValueError:  # a test outside this checkout (pytest given another folder): paths say nothing
            path = ""
        for tier in sorted(tiers_of(item, path)):
            if item.get_closest_marker(tier) is None:
                item.add_marker(getattr(pytest.mark, tier))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """tests/launch.py refuses to start torchrun for a test outside the torchrun tier, so a launch the tier
    rules missed fails at once instead of slowing the unit tier unseen. Set before any fixture of the test
    (a module-scoped one may launch too)."""
    launch.current_test_is_torchrun = item.get_closest_marker("torchrun") is not None
    launch.current_test_id = item.nodeid


#: Round numbers so a reader can redo every estimate by hand (see tests/solver/test_cost.py).
HAND_PROFILE: dict[str, Any] = {
    "name": "hand",
    "compute": {"flops_per_token": 1e9, "flops_per_token_sq": 1e5, "ms_per_tflop": 2.0, "fixed_ms": 0.5},
    "comm": {"bytes_per_token": 2**20, "ms_per_mib": 0.001, "fixed_ms": 0.2},
    "memory": {"bucket_tokens": 100},
    "microbatch_ms": 3.0,
}


@pytest.fixture
def hand_profile() -> Profile:
    return profile_from_dict(HAND_PROFILE)


def make_request(
    batches: list[list[int]], *, dp: int = 1, cp: int = 2, bucket: int = 100, solver: str = "skrull", **extra: Any
) -> Request:
    doc = {
        "batches": batches,
        "parallel": {"dp": dp, "cp": cp},
        "profile": {**HAND_PROFILE, "memory": {"bucket_tokens": bucket}},
        "solver": solver,
        **extra,
    }
    return request_from_dict(doc)


def allgather_planners() -> tuple[str, ...]:
    """Registered planners that can plan a request with the default ``cp_modes`` (all-gather): every one but
    those that plan Ulysses only (``xtuner``), which tests/solver/test_cp_modes.py covers with its own requests."""
    from skrull.solver.planners.registry import get_planner, planner_names
    from skrull.solver.planning import planner_cp_modes

    return tuple(n for n in planner_names() if "allgather" in planner_cp_modes(get_planner(n)))


def cpu_seconds(call: Callable[[], T]) -> tuple[T, float]:
    """``call()`` and the CPU seconds it used, its own and its waited-for child processes' (forked solvers).

    A planner keeps its budget in wall time, which a loaded machine stretches; the CPU it burns does not
    grow with the load (a busy machine gives it less), so tests bound this and the wall-time promises are
    measured in bench/ (bench/budgets.py). A planner that ignored its budget still fails such a bound."""
    before = os.times()
    result = call()
    after = os.times()
    used = sum(
        getattr(after, f) - getattr(before, f) for f in ("user", "system", "children_user", "children_system")
    )
    return result, used

"""Shared fixtures: small hand-checkable profiles and request builders."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import settings

from skrull.solver.io import request_from_dict
from skrull.solver.profile import Profile, profile_from_dict
from skrull.solver.types import Request

# Property tests are deterministic (the same examples every run, so CI never fails by chance);
# HYPOTHESIS_PROFILE=explore draws new random examples, to hunt for counterexamples by hand.
settings.register_profile("deterministic", derandomize=True, database=None)
settings.register_profile("explore")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))

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

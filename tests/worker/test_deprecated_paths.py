"""Modules that moved stay importable from their old paths: the same objects, with a ``DeprecationWarning``
that names the module to import from instead."""

from __future__ import annotations

import importlib
import sys

import pytest


@pytest.mark.parametrize(
    ("old", "new", "names"),
    [
        (
            "skrull.worker.planner_process",
            "skrull.worker.planner.client",
            {
                "ProcessPlans": "skrull.worker.planner.client",
                "PlannerError": "skrull.worker.planner.client",
                "PlanningBudget": "skrull.worker.planner.budget",
                "unagreed_budget_s": "skrull.worker.planner.budget",
                "Planner": "skrull.worker.planner.server",
                "serve": "skrull.worker.planner.server",
            },
        ),
        (
            "skrull.worker.execute",
            "skrull.worker.layer_check",
            {name: "skrull.worker.layer_check" for name in ("DTYPES", "ExecuteConfig", "LayerConfig", "execute_plan")},
        ),
        ("skrull.cli.execute", "skrull.cli.layer_check", {"add_parser": "skrull.cli.layer_check"}),
    ],
)
def test_an_old_module_path_still_imports_its_names_and_warns_naming_the_new_one(
    old: str, new: str, names: dict[str, str]
) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        module = importlib.import_module(old)
    for name, home in names.items():
        assert getattr(module, name) is getattr(importlib.import_module(home), name), name

"""Every module path that moved when solver/ and api/ were grouped by concern still imports, warns that it
moved, and hands out the very objects of the module it names (not copies), so old code keeps working."""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from types import ModuleType

import pytest

#: old import path -> where the module lives now
MOVED = {
    "skrull.solver.derive": "skrull.solver.profiles.derive",
    "skrull.solver.gpus": "skrull.solver.profiles.gpus",
    "skrull.solver.hf_config": "skrull.solver.profiles.hf_config",
    "skrull.solver.compare": "skrull.solver.reports.compare",
    "skrull.solver.render": "skrull.solver.reports.render",
    "skrull.solver.datasets": "skrull.solver.lengths.datasets",
    "skrull.api.solving": "skrull.api.solvers.pool",
}


def fresh(name: str) -> ModuleType:
    """Run the module's code once more in a module object of its own, registered nowhere: its warnings are
    given again, and the modules other tests use (in ``sys.modules`` and as their package's attributes) stay
    the ones they hold."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.loader is not None, name
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_imports_warns_and_re_exports_the_new_module(old: str) -> None:
    if old.startswith("skrull.api."):
        pytest.importorskip("fastapi")
    new = importlib.import_module(MOVED[old])
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {MOVED[old]}"):
        alias = fresh(old)
    public = [name for name in vars(new) if not name.startswith("_")]
    assert public
    for name in public:
        assert getattr(alias, name) is getattr(new, name), name


@pytest.mark.parametrize("new", sorted(MOVED.values()))
def test_the_new_paths_import_without_a_warning(new: str) -> None:
    if new.startswith("skrull.api."):
        pytest.importorskip("fastapi")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        fresh(new)

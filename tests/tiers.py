"""The test tiers: which tests ``make test-fast`` leaves to ``make test``, decided here and applied by
tests/conftest.py at collection (``pytest_collection_modifyitems``), so a test written later in the same
file, with the same fixture or through the same helper is classified without a marker of its own.

- ``torchrun``: starts ``torchrun`` (tests/launch.py) or other multi-process ``torch.distributed`` jobs
  (``torch.multiprocessing``, the library's ``skrull.worker.launch`` and what calls it); the conformance
  matrix.
- ``server``: a live HTTP server or another service in a subprocess (``skrull serve``, ``skrull
  solver-worker``, a browser).
- ``postgres``: needs the PostgreSQL server on 127.0.0.1:5432 (tests/api/pg.py).
- ``slow``: any other test that takes seconds each: one that starts a Python process (a CLI run, an
  example, a fresh interpreter importing the package), the files measured to take tens of seconds, and a
  test measured at seconds in a file of quick ones, which carries ``@pytest.mark.slow`` itself (the
  marker moves with the test; the measurements are in docs/testing.md).

A test is in a tier when any of these holds: its file is listed below (``*_PATHS``), it uses a fixture
listed below (``*_FIXTURES``), a parametrized fixture it uses has the tier's name as its value (the store
contract's ``backend`` and ``store_location`` on ``"postgres"``), or its code, its fixtures' code, or a
helper they call in tests/ (followed through every call, in any module of tests/) names one of the
``SENTINELS`` below; a tier that is one of a parametrized fixture's values counts only on that value.
``make test-fast`` runs what is in none of them: the unit tier."""

from __future__ import annotations

import importlib
import inspect
import types
from collections.abc import Iterable
from typing import Any

import pytest

TIERS = ("torchrun", "server", "postgres", "slow")

#: A marker's description, as pyproject.toml registers it (tests/test_tiers.py checks they agree).
DESCRIPTIONS = {
    "torchrun": "starts torchrun or another multi-process torch.distributed job (minutes)",
    "server": "starts a live HTTP server or another service in a subprocess",
    "postgres": "needs the PostgreSQL server on 127.0.0.1:5432",
    "slow": "other tests of seconds each: Python processes started, long property or solver runs",
}

#: Files (or folders, ending in /) by their path from the repository's root.
TORCHRUN_PATHS = ("tests/conformance/",)
SERVER_PATHS = ("tests/api/test_view_in_browser.py", "tests/cli/test_serve.py")
POSTGRES_PATHS = ("tests/api/store/test_postgres.py",)
SLOW_PATHS = (
    "tests/api/solvers/test_pool.py",  # solver processes killed, retried and timed out: 5-25 s each
    "tests/api/test_retention.py",  # waits out a retention
    "tests/worker/hf/test_trainer_arguments.py",  # Trainer steps against the plain step: 10-40 s each
    "tests/worker/test_gathered_kv_memory.py",  # models run per case to read what they keep: 4-18 s each
)

SERVER_FIXTURES = frozenset({"live_server", "live_server_factory", "solver_worker_factory"})
POSTGRES_FIXTURES = frozenset({"pg_db"})


#: What puts a test in a tier when its code (or a helper's) names it: functions and classes by module and
#: qualified name, modules by name (nothing is imported to compare: collecting tests/solver stays quick).
SENTINELS = {
    "tests.launch.run_torchrun": "torchrun",
    "tests.launch.start_torchrun": "torchrun",
    "tests.launch.torchrun_command": "torchrun",
    "torch.multiprocessing": "torchrun",
    # the library's own gloo process groups (worker/launch.py) and what starts them
    "skrull.worker.launch.launch": "torchrun",
    "skrull.worker.layer_check.execute_plan": "torchrun",
    "skrull.worker.hf.finetune.finetune_plan": "torchrun",
    "skrull.worker.profiling.comm.measure_comm": "torchrun",
    "tests.api.conftest.LiveServer": "server",
    "tests.api.conftest.SolverWorker": "server",
    "tests.api.pg.temporary_database": "postgres",
    "tests.api.pg.require_postgres": "postgres",
    "subprocess": "slow",  # every subprocess a test starts here is a Python process, or waits on one
}
#: Dotted module names that count when a function imports them itself (``import torch.multiprocessing as mp``).
SENTINEL_MODULES = {"torch.multiprocessing": "torchrun", "subprocess": "slow"}


def _codes(code: types.CodeType) -> Iterable[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _import_quietly(name: str) -> types.ModuleType | None:
    """The module, imported if need be without leaving a trace in the planner registry: some test modules
    register planners on import (tests/api/plugin_planners.py), which only their own fixtures may do."""
    from skrull.solver.planners import registry

    saved = dict(registry._REGISTRY)
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
    finally:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(saved)


def _ours(obj: Any) -> bool:
    return (getattr(obj, "__module__", None) or "").startswith("tests")


class _Reach:
    """The tiers a function reaches through the names its code mentions, followed into tests/ (cached)."""

    def __init__(self) -> None:
        self.cache: dict[int, frozenset[str]] = {}

    def of(self, obj: Any) -> frozenset[str]:
        if isinstance(obj, types.ModuleType):
            name = obj.__name__
        else:
            name = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
        if name in SENTINELS:
            return frozenset({SENTINELS[name]})
        obj = getattr(getattr(obj, "hypothesis", None), "inner_test", obj)  # a @given test's own body
        obj = inspect.unwrap(obj) if callable(obj) else obj
        if not _ours(obj) or not isinstance(obj, (types.FunctionType, type)):
            return frozenset()
        key = id(obj)
        if key in self.cache:
            return self.cache[key]
        self.cache[key] = frozenset()  # a cycle (recursion, mutual helpers) adds nothing
        tiers: set[str] = set()
        functions = [obj] if isinstance(obj, types.FunctionType) else [
            f for f in vars(obj).values() if isinstance(f, (types.FunctionType, staticmethod, classmethod, property))
        ]  # fmt: skip
        for f in functions:
            f = getattr(f, "__func__", None) or getattr(f, "fget", None) or f
            if isinstance(f, types.FunctionType):
                tiers |= self._of_function(f)
        self.cache[key] = frozenset(tiers)
        return self.cache[key]

    def _of_function(self, f: types.FunctionType) -> set[str]:
        tiers: set[str] = set()
        names = {n for code in _codes(f.__code__) for n in code.co_names}
        scopes: list[dict[str, Any]] = [f.__globals__]
        for name in names:
            module = f.__globals__.get(name)
            if isinstance(module, types.ModuleType) and module.__name__.startswith("tests"):
                scopes.append(vars(module))  # ``launch.run_torchrun``: the attribute's name is in co_names too
            if name in SENTINEL_MODULES:
                tiers.add(SENTINEL_MODULES[name])
            if name.startswith("tests.") and "." in name:  # imported inside the function: look there too
                module = _import_quietly(name)
                if module is not None:
                    scopes.append(vars(module))
        for name in names:
            for scope in scopes:
                if name in scope:
                    tiers |= self.of(scope[name])
                    break
        return tiers


_REACH = _Reach()


def _on_path(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == p or (p.endswith("/") and path.startswith(p)) for p in prefixes)


def tiers_of(item: pytest.Item, root_relative_path: str) -> set[str]:
    """The tiers of one collected test (empty: the unit tier)."""
    found: set[str] = set()
    for tier, paths in (
        ("torchrun", TORCHRUN_PATHS),
        ("server", SERVER_PATHS),
        ("postgres", POSTGRES_PATHS),
        ("slow", SLOW_PATHS),
    ):
        if _on_path(root_relative_path, paths):
            found.add(tier)
    fixtures = set(getattr(item, "fixturenames", ()))
    if fixtures & SERVER_FIXTURES:
        found.add("server")
    if fixtures & POSTGRES_FIXTURES:
        found.add("postgres")
    params: dict[str, Any] = getattr(getattr(item, "callspec", None), "params", {})
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs if info is not None else {}
    for name in fixtures:
        defs = definitions.get(name) or ()
        if not defs:
            continue
        reached = _REACH.of(defs[-1].func)
        if defs[-1].params is not None:  # a parametrized fixture: its value says which backend it is on
            value = params.get(name)
            reached = (reached - {p for p in defs[-1].params if p in TIERS}) | ({value} & set(TIERS))
        found |= reached
    found |= _REACH.of(getattr(item, "obj", None))
    return found

"""The exact solvers' Python packages, and whether this environment can import them.

CP-SAT (``ortools``) and SCIP (``pyscipopt``) are dependencies of the distribution, imported on first
use so that ``import skrull.solver`` needs numpy alone. A process can still lack them: a GPU host that
runs the project from a checkout with torch and numpy only (``bench/gpu_check.sh`` promises that path),
or a worker image trimmed by hand. There ``auto``, the loader's default, leaves out what it cannot
import (its exact model, the ``hydraulis`` start) and plans with the rest: the same request on the same
environment still gives the same plan. What a request names, a planner (``ilp``, ``ilp-flex``,
``hydraulis``) or a ``backend``, is refused instead, with one error naming the missing package.
"""

from __future__ import annotations

import functools
import importlib.util
import sys

from skrull.solver.errors import BackendMissingError

#: The package each backend imports.
PACKAGES: dict[str, str] = {"cpsat": "ortools", "scip": "pyscipopt"}


@functools.cache
def module_installed(module: str) -> bool:
    """Whether ``module``'s top-level package can be imported here (found, not imported); a package
    blocked in ``sys.modules`` (set to ``None``, as Python documents for that) counts as missing."""
    top = module.split(".")[0]
    if top in sys.modules:
        return sys.modules[top] is not None
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def backend_installed(backend: str) -> bool:
    """Whether ``backend``'s package is importable; a name not in ``PACKAGES`` is left to the caller's
    own validation (True)."""
    package = PACKAGES.get(backend)
    return package is None or module_installed(package)


#: What a refusal suggests besides installing the package.
CHOOSE_AUTO = "or choose solver 'auto', which plans without it"


def require_module(module: str, *, field: str, value: str, advice: str = CHOOSE_AUTO) -> None:
    """Refuse ``field = value`` when ``module`` cannot be imported (``BackendMissingError``)."""
    if not module_installed(module):
        package = module.split(".")[0]
        raise BackendMissingError(
            field,
            value,
            f"needs the Python package {package!r}, which this environment cannot import (pip install {package}; "
            f"it is a dependency of skrull), {advice}",
        )


def require_backend(backend: str, *, solver: str | None = None) -> None:
    """Refuse an exact solve on ``backend`` when its package cannot be imported: the error names the
    request's ``backend``, or ``solver`` (the planner's name) when the backend is the planner's default."""
    package = PACKAGES.get(backend)
    if package is None:
        return
    if solver is None:  # the request named it: leaving it out is the way on
        require_module(package, field="backend", value=backend, advice="or leave backend out")
        return
    others = [name for name in PACKAGES if name != backend and backend_installed(name)]
    advice = f"set backend {others[0]!r}, " if others else ""
    require_module(package, field="solver", value=solver, advice=f"{advice}{CHOOSE_AUTO}")

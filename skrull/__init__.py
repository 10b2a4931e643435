"""Skrull: data scheduling for long-context fine-tuning with DP x CP.

Subpackages: :mod:`skrull.solver` (planning library, numpy only), :mod:`skrull.api` (the REST service),
:mod:`skrull.worker` (GPU-side execution with torch), :mod:`skrull.corpus` (token counts of SFT data),
:mod:`skrull.cli` (the ``skrull`` command). Bundled profiles and length distributions ship as package
data in :mod:`skrull.profiles` and :mod:`skrull.distributions`.

Where the subpackages are. An installed distribution has them under this folder (setuptools'
``package-dir`` in pyproject.toml maps ``skrull.solver`` to the repository's ``solver/``, and so on). In a
source checkout they stay top-level folders beside this one (the repository's layout); when this file is
imported from a checkout (``PYTHONPATH`` set to it, or run from its root), the checkout's root joins the
package's search path, so ``skrull.solver`` is ``<checkout>/solver`` without installing and without links.
"""

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

try:
    __version__ = version("skrull")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"


def _checkout_root() -> Path | None:
    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and (root / "solver" / "__init__.py").is_file():
        return root
    return None


_root = _checkout_root()
if _root is not None and str(_root) not in __path__:
    __path__.append(str(_root))

__all__ = ["__version__"]

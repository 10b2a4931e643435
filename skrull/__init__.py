"""Skrull: data scheduling for long-context fine-tuning with DP x CP.

Subpackages: :mod:`skrull.solver` (planning library, numpy only), :mod:`skrull.api` (the REST service),
:mod:`skrull.worker` (GPU-side execution with torch), :mod:`skrull.corpus` (token counts of SFT data),
:mod:`skrull.cli` (the ``skrull`` command). Bundled profiles and length distributions ship as package
data under ``skrull/profiles`` and ``skrull/distributions``.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("skrull")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]

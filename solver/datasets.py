"""Deprecated alias: this module moved to ``skrull.solver.lengths.datasets``; import it from there."""

from skrull.solver.lengths.datasets import *  # noqa: F403
from skrull.solver.moved import warn_moved

warn_moved(__name__, "skrull.solver.lengths.datasets")

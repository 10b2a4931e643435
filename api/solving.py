"""Deprecated alias: this module moved to ``skrull.api.solvers.pool``; import it from there."""

from skrull.api.solvers.pool import *  # noqa: F403
from skrull.solver.moved import warn_moved

warn_moved(__name__, "skrull.api.solvers.pool")

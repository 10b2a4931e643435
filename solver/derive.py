"""Deprecated alias: this module moved to ``skrull.solver.profiles.derive``; import it from there."""

from skrull.solver.moved import warn_moved
from skrull.solver.profiles.derive import *  # noqa: F403

warn_moved(__name__, "skrull.solver.profiles.derive")

"""Deprecated alias: this module moved to ``skrull.solver.reports.render``; import it from there."""

from skrull.solver.moved import warn_moved
from skrull.solver.reports.render import *  # noqa: F403

warn_moved(__name__, "skrull.solver.reports.render")

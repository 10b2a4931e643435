"""Deprecated alias: this module moved to ``skrull.solver.profiles.hf_config``; import it from there."""

from skrull.solver.moved import warn_moved
from skrull.solver.profiles.hf_config import *  # noqa: F403

warn_moved(__name__, "skrull.solver.profiles.hf_config")

"""Deprecated: the ``skrull execute`` command's module is now cli/layer_check.py, named for what it does (run a
plan through one attention layer, optionally checked). Its names stay importable from here, with a
``DeprecationWarning`` naming the new module.
"""

from __future__ import annotations

import warnings

from skrull.cli.layer_check import EXIT_CHECK_FAILED, add_parser, cmd_execute

__all__ = ["EXIT_CHECK_FAILED", "add_parser", "cmd_execute"]

warnings.warn("skrull.cli.execute is deprecated: import from skrull.cli.layer_check", DeprecationWarning, stacklevel=2)

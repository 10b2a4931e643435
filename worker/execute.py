"""Deprecated: this module is now worker/layer_check.py (a plan run through one attention layer and checked
against each sequence alone), named for what it does; "execute" also named the service's job runner and the
CLI command. Its public names stay importable from here, with a ``DeprecationWarning`` naming the new module.
"""

from __future__ import annotations

import warnings

from skrull.worker.layer_check import (
    DTYPES,
    ErrorRow,
    ExecuteConfig,
    ExecuteResult,
    LayerConfig,
    RankOutput,
    RankTiming,
    collect,
    compare,
    execute_plan,
    execute_rank,
    make_layer,
    reference_run,
    run_rank,
)

__all__ = [
    "DTYPES",
    "ErrorRow",
    "ExecuteConfig",
    "ExecuteResult",
    "LayerConfig",
    "RankOutput",
    "RankTiming",
    "collect",
    "compare",
    "execute_plan",
    "execute_rank",
    "make_layer",
    "reference_run",
    "run_rank",
]

warnings.warn(
    "skrull.worker.execute is deprecated: import from skrull.worker.layer_check",
    DeprecationWarning,
    stacklevel=2,
)

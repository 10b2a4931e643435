"""Progress bars of the worker's long commands (``skrull finetune``, ``skrull profile``), drawn by tqdm on
stderr so stdout stays the report. ``enabled=None`` draws only on a terminal (tqdm's own test), ``True``
always, ``False`` never."""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm


def progress_bar(*, total: int, desc: str, unit: str, enabled: bool | None) -> tqdm[Any]:
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        file=sys.stderr,
        disable=None if enabled is None else not enabled,
        dynamic_ncols=True,
    )

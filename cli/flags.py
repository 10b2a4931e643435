"""Flags shared by the long-running commands."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_progress_flag(parser: Any) -> None:
    """``--progress`` / ``--no-progress``. By default: a tqdm bar on a terminal, and one flushed line per
    phase anywhere else (a pipe, a CI log), so a run of minutes is never silent until its end."""
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress on stderr: a bar on a terminal, one line per phase elsewhere (default); "
        "--progress draws the bar even when piped, --no-progress prints none",
    )


def say_progress(line: str, *, flag: bool | None) -> None:
    """One line of progress on stderr, flushed, for a phase no bar measures (planning, starting processes,
    checking); nothing under ``--no-progress``."""
    if flag is not False:
        print(line, file=sys.stderr, flush=True)

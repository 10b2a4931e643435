"""Flags shared by the long-running commands."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_progress_flag(parser: Any) -> None:
    """``--progress`` / ``--no-progress``: a tqdm bar on stderr; by default only when stderr is a terminal,
    so logs and captured output stay clean."""
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress on stderr (default: only on a terminal)",
    )


def progress_enabled(flag: bool | None) -> bool:
    """What ``--progress`` / ``--no-progress`` / neither (a terminal) asks for."""
    return sys.stderr.isatty() if flag is None else flag


def say_progress(line: str) -> None:
    """One line of progress on stderr, for a phase no bar can measure (starting processes)."""
    print(line, file=sys.stderr, flush=True)

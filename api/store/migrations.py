"""Versioned schema migrations shared by the store backends.

Each backend lists its ``Migration`` steps in order (versions 1, 2, 3, ...). The database keeps a
``schema_version`` table with one row per applied step; opening a store applies the steps above the
highest recorded version in one transaction, so every replica that starts against the same database
either sees the whole new schema or the whole old one. A database whose version is newer than the code
(a rolled-back deployment) is refused instead of being written with an older schema in mind.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]


class SchemaTooNewError(RuntimeError):
    """The database was migrated by a newer release than this one."""

    def __init__(self, *, found: int, known: int) -> None:
        self.found, self.known = found, known
        super().__init__(
            f"the job store's schema is version {found}, newer than this release knows ({known}); "
            "run the newer release, or restore a backup made before the upgrade"
        )


def check_ordered(steps: Sequence[Migration]) -> int:
    """The latest version of ``steps`` (which must be numbered 1, 2, ... in order)."""
    for expected, step in enumerate(steps, start=1):
        assert step.version == expected, f"migration {step.description!r} is numbered {step.version}, not {expected}"
    return len(steps)


def pending(steps: Sequence[Migration], *, current: int) -> list[Migration]:
    """The steps to apply on a database at version ``current``."""
    latest = check_ordered(steps)
    if current > latest:
        raise SchemaTooNewError(found=current, known=latest)
    return [s for s in steps if s.version > current]

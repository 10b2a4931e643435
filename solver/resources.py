"""Where bundled data lives: profiles and length distributions ship inside the ``skrull`` package.

They are found through :mod:`importlib.resources`, so a wheel installed anywhere finds them as well as a
source checkout. Users add their own directories with ``SKRULL_PROFILES_DIR`` /
``SKRULL_DISTRIBUTIONS_DIR`` (one or more directories separated by ``os.pathsep``); those are searched
before the bundled folder, so a user file of the same name takes precedence.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

PROFILES_DIR_ENV = "SKRULL_PROFILES_DIR"
DISTRIBUTIONS_DIR_ENV = "SKRULL_DISTRIBUTIONS_DIR"


def bundled_dir(kind: str) -> Path:
    """The bundled folder ``kind`` (``profiles`` or ``distributions``): the package ``skrull.<kind>``, in
    an installed distribution or a source checkout alike (skrull/__init__.py)."""
    if kind not in ("profiles", "distributions"):
        raise ValueError(f"kind: {kind!r}: bundled data is 'profiles' or 'distributions'")
    return Path(str(resources.files(f"skrull.{kind}")))


def search_dirs(kind: str, env_var: str) -> tuple[Path, ...]:
    """User directories from ``env_var`` (in order), then the bundled folder."""
    user = tuple(Path(p) for p in os.environ.get(env_var, "").split(os.pathsep) if p)
    return (*user, bundled_dir(kind))


def find_file(kind: str, env_var: str, file_name: str) -> Path | None:
    """The first ``file_name`` over :func:`search_dirs`, or None."""
    for folder in search_dirs(kind, env_var):
        path = folder / file_name
        if path.is_file():
            return path
    return None


def list_stems(kind: str, env_var: str) -> tuple[str, ...]:
    """Sorted, de-duplicated stems of the ``*.json`` files over :func:`search_dirs`."""
    stems = {p.stem for folder in search_dirs(kind, env_var) if folder.is_dir() for p in folder.glob("*.json")}
    return tuple(sorted(stems))

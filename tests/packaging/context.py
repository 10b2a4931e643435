"""The image's build context and the commands that turn it into an installed ``skrull``, in one place.

The wheel test runs these steps on this machine; the Dockerfile test checks that ``docker/Dockerfile``
runs the same ones. Docker copies the repository root minus what ``.dockerignore`` excludes, so the
wheel test builds from exactly such a copy (a wheel that needs an excluded file fails here first).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERIGNORE = ROOT / ".dockerignore"

#: ``pip wheel`` of the build context root, without dependencies: the image's build stage and the test.
WHEEL_COMMAND = ("pip", "wheel", "--no-deps", "--wheel-dir")
#: The extra the service image installs the wheel with.
IMAGE_EXTRAS = "api"


def ignore_patterns(path: Path = DOCKERIGNORE) -> tuple[str, ...]:
    """The exclusion patterns of a ``.dockerignore`` (comments and blank lines dropped)."""
    patterns = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("!"):
            raise ValueError(f".dockerignore: {line!r}: exceptions are not supported by the build-context check")
        patterns.append(line.strip("/"))
    return tuple(patterns)


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """Docker's (Go ``filepath.Match``) pattern as a regex: ``*`` and ``?`` stop at ``/``, ``**`` does not."""
    out = []
    k = 0
    while k < len(pattern):
        if pattern.startswith("**/", k):
            out.append("(?:.*/)?")
            k += 3
        elif pattern.startswith("**", k):
            out.append(".*")
            k += 2
        elif pattern[k] == "*":
            out.append("[^/]*")
            k += 1
        elif pattern[k] == "?":
            out.append("[^/]")
            k += 1
        else:
            out.append(re.escape(pattern[k]))
            k += 1
    return re.compile("".join(out))


def is_ignored(relative: str, patterns: tuple[str, ...]) -> bool:
    """Docker's rule: a path is excluded when it, or a folder above it, matches a pattern."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: k + 1]) for k in range(len(parts))]
    return any(_pattern_regex(p).fullmatch(prefix) for p in patterns for prefix in prefixes)


def copy_build_context(destination: Path, source: Path = ROOT) -> Path:
    """Copy ``source`` as ``docker build`` sends it: ``.dockerignore`` applied, links kept as links."""
    patterns = ignore_patterns(source / ".dockerignore")
    destination.mkdir(parents=True)
    for folder, dirs, files in os.walk(source):
        rel_folder = Path(folder).relative_to(source).as_posix()
        prefix = "" if rel_folder == "." else rel_folder + "/"
        kept_dirs = []
        for name in sorted(dirs):
            path = Path(folder) / name
            if is_ignored(prefix + name, patterns):
                continue
            if path.is_symlink():
                (destination / prefix / name).symlink_to(os.readlink(path))
            else:
                (destination / prefix / name).mkdir()
                kept_dirs.append(name)
        dirs[:] = kept_dirs
        for name in files:
            path = Path(folder) / name
            if is_ignored(prefix + name, patterns):
                continue
            if path.is_symlink():
                (destination / prefix / name).symlink_to(os.readlink(path))
            else:
                with contextlib.suppress(FileNotFoundError):  # a file another process removed meanwhile
                    shutil.copy2(path, destination / prefix / name)
    return destination

"""The warning a deprecated module path gives when it is imported.

When a module moves (solver/ and api/ were grouped by concern: ``solver.derive`` is now
``solver.profiles.derive``), its old path stays as a one-line alias that re-exports the new module's
public names and calls ``warn_moved``, so code written against the old path keeps working and is told
where to import from instead. ``DeprecationWarning`` is shown by default only to code run as ``__main__``
and under test runners, so a library that still imports an old path does not print to its users' logs.
"""

from __future__ import annotations

import warnings


def warn_moved(old: str, new: str) -> None:
    """Warn, at the line that imported ``old``, that the module now lives at ``new``."""
    # stacklevel 3: this function, the alias module's body, then the importer (the import machinery's own
    # frames are skipped by the warnings module).
    warnings.warn(f"{old} moved to {new}; import it from there", DeprecationWarning, stacklevel=3)

"""Bundled profiles: package data (``*.json``, each number with its source), found by
:func:`skrull.solver.resources.bundled_dir`. No code lives here."""

"""Bundled length distributions: package data (``*.json``, each with its source), found by
:func:`skrull.solver.resources.bundled_dir`. No code lives here."""

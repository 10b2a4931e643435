"""The ``skrull`` command line."""

"""Planners: one Protocol (``base.Planner``), one registry (``registry``)."""

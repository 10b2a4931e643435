"""Measuring a device into a profile (measure, comm, run: torch) and fitting it (fit, document, check: no torch)."""

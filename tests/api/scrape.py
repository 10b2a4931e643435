"""Read a ``/metrics`` answer with ``prometheus_client``'s own parser, never by matching text."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Sample = tuple[str, tuple[tuple[str, str], ...]]


def samples(text: str) -> dict[Sample, float]:
    """Every sample of an exposition, keyed by name and its labels sorted by name."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def families(text: str) -> dict[str, str]:
    """Metric family name -> type (counter, gauge, histogram)."""
    return {f.name: f.type for f in text_string_to_metric_families(text)}

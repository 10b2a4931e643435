"""Prometheus text exposition of the service's metrics."""

from __future__ import annotations

from skrull.api.metrics import Counter, Histogram, Metrics


def test_histograms_are_cumulative_with_sum_and_count() -> None:
    h = Histogram("x_seconds", "help", ("solver",), (0.1, 1.0))
    for v in (0.05, 0.5, 0.5, 3.0):
        h.observe(v, "skrull")
    lines = list(h.render())
    assert lines[:2] == ["# HELP x_seconds help", "# TYPE x_seconds histogram"]
    assert 'x_seconds_bucket{solver="skrull",le="0.1"} 1' in lines
    assert 'x_seconds_bucket{solver="skrull",le="1.0"} 3' in lines
    assert 'x_seconds_bucket{solver="skrull",le="+Inf"} 4' in lines
    assert 'x_seconds_sum{solver="skrull"} 4.05' in lines
    assert 'x_seconds_count{solver="skrull"} 4' in lines


def test_label_values_are_escaped() -> None:
    c = Counter("y_total", "help", ("route",))
    c.inc('a"b\\c\nd')
    assert 'y_total{route="a\\"b\\\\c\\nd"} 1.0' in list(c.render())


def test_every_metric_has_help_and_type() -> None:
    text = Metrics().render()
    helps = [ln.split()[2] for ln in text.splitlines() if ln.startswith("# HELP")]
    types = [ln.split()[2] for ln in text.splitlines() if ln.startswith("# TYPE")]
    assert helps == types and "skrull_solve_duration_seconds" in helps and "skrull_queue_depth" in helps

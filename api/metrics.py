"""Prometheus metrics in the text exposition format (version 0.0.4), kept in the server process.

Solve durations are measured in the solver processes and reported to the server with each job's end,
so one scrape of ``/metrics`` sees every solve of this server. Gauges that describe the store (queue
depth, jobs by status) are read from the store at scrape time, so they are right even for jobs that
other servers on the same store accepted.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Iterable, Sequence

#: Solve-duration buckets (s): planning is milliseconds for heuristics, up to minutes for exact solvers.
SOLVE_BUCKETS_S: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
#: Request-latency buckets (s).
HTTP_BUCKETS_S: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30, 60)

LabelValues = tuple[str, ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _num(x: float) -> str:
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(float(x))


class Counter:
    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        self.name, self.help, self.label_names = name, help_text, tuple(labels)
        self._values: dict[LabelValues, float] = {}
        self._lock = threading.Lock()

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        with self._lock:
            self._values[labels] = self._values.get(labels, 0.0) + amount

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} counter"
        for labels, v in sorted(self._values.items()):
            yield f"{self.name}{_labels(self.label_names, labels)} {_num(v)}"


class Gauge:
    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        self.name, self.help, self.label_names = name, help_text, tuple(labels)
        self._values: dict[LabelValues, float] = {}

    def set(self, value: float, *labels: str) -> None:
        self._values[labels] = value

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} gauge"
        for labels, v in sorted(self._values.items()):
            yield f"{self.name}{_labels(self.label_names, labels)} {_num(v)}"


class Histogram:
    def __init__(self, name: str, help_text: str, labels: Sequence[str], buckets: Sequence[float]) -> None:
        self.name, self.help, self.label_names = name, help_text, tuple(labels)
        self.buckets = tuple(sorted(buckets))
        self._counts: dict[LabelValues, list[int]] = {}
        self._sums: dict[LabelValues, float] = {}
        self._lock = threading.Lock()

    def observe(self, value: float, *labels: str) -> None:
        k = bisect.bisect_left(self.buckets, value)
        with self._lock:
            counts = self._counts.get(labels)
            if counts is None:
                counts = self._counts[labels] = [0] * (len(self.buckets) + 1)
                self._sums[labels] = 0.0
            counts[k] += 1
            self._sums[labels] += value

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} histogram"
        for labels in sorted(self._counts):
            counts = self._counts[labels]
            running = 0
            for bound, n in zip((*self.buckets, math.inf), counts, strict=True):
                running += n
                le = 'le="' + _num(bound) + '"'
                yield f"{self.name}_bucket{_labels(self.label_names, labels, le)} {running}"
            yield f"{self.name}_sum{_labels(self.label_names, labels)} {_num(self._sums[labels])}"
            yield f"{self.name}_count{_labels(self.label_names, labels)} {running}"


class Metrics:
    """Every metric the service exports."""

    def __init__(self) -> None:
        self.solve_seconds = Histogram(
            "skrull_solve_duration_seconds",
            "Wall time of solving one job in a solver process, by solver and outcome (solved|failed).",
            ("solver", "status"),
            SOLVE_BUCKETS_S,
        )
        self.http_seconds = Histogram(
            "skrull_http_request_duration_seconds",
            "HTTP request latency by route template, method and status code.",
            ("route", "method", "code"),
            HTTP_BUCKETS_S,
        )
        self.submissions = Counter(
            "skrull_submissions_total", "Plan submissions by outcome (created|duplicate|requeued).", ("outcome",)
        )
        self.plans_served = Counter(
            "skrull_plans_served_total", "Solved plans and rank views served, by kind (plan|rank_view).", ("kind",)
        )
        self.errors = Counter(
            "skrull_errors_total", "Problem answers, by HTTP status and problem type.", ("status", "type")
        )
        self.jobs_retried = Counter(
            "skrull_jobs_retried_total", "Jobs queued again after their solver process vanished."
        )
        self.jobs_failed = Counter("skrull_jobs_failed_total", "Jobs failed, by reason.", ("reason",))
        self.solver_restarts = Counter("skrull_solver_restarts_total", "Solver processes restarted after dying.")
        self.plans_deleted = Counter(
            "skrull_plans_deleted_total", "Plans deleted, by reason (request|expired).", ("reason",)
        )
        self.queue_depth = Gauge("skrull_queue_depth", "Jobs queued in the store, waiting for a solver process.")
        self.jobs = Gauge("skrull_jobs", "Jobs in the store by status.", ("status",))
        self.solver_processes = Gauge("skrull_solver_processes", "Live solver processes of this server.")

    def render(self) -> str:
        parts: list[str] = []
        for metric in (
            self.solve_seconds,
            self.queue_depth,
            self.jobs,
            self.plans_served,
            self.submissions,
            self.errors,
            self.jobs_retried,
            self.jobs_failed,
            self.solver_restarts,
            self.plans_deleted,
            self.solver_processes,
            self.http_seconds,
        ):
            parts.extend(metric.render())
        return "\n".join(parts) + "\n"

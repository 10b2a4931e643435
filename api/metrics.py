"""The service's Prometheus metrics, kept and exposed by ``prometheus_client``.

Two ways of running, chosen by ``prometheus_client`` itself from ``PROMETHEUS_MULTIPROC_DIR`` when it is
first imported:

* Multi-process mode (``skrull serve`` creates the directory before anything imports the library, hands
  it to its solver processes through the environment and removes it at exit, ``cli/serve.py``): every
  process writes its counters and histograms into memory-mapped files there; the solver processes
  record the durations of the solves they run themselves, and a scrape of ``/metrics`` adds up every
  process's files (``MultiProcessCollector``), so it sees every solve of this server, including those
  of solver processes that died and were replaced.
* One process (the app built in-process, as tests and embedders do): each app keeps its own registry,
  and the solve durations reach it with each job's end (``api.solvers.pool`` events).

Gauges that describe the store (queue depth, jobs by status) and the live solver processes are read at
scrape time and exposed by a collector built for that scrape, so they are right even for jobs that other
servers on the same store accepted, and no process's stale value is ever summed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from skrull.api.metrics_dir import MULTIPROC_ENV

#: Solve-duration buckets (s): planning is milliseconds for heuristics, up to minutes for exact solvers.
SOLVE_BUCKETS_S: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
#: Request-latency buckets (s).
HTTP_BUCKETS_S: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30, 60)
JOB_STATUSES = ("queued", "solving", "solved", "failed")
#: The ``method`` label's values: any other method (made up by a client) is counted as ``other``, so no
#: client can add label values (and memory, and scrape time) to the exposition.
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def method_label(method: str) -> str:
    return method if method in HTTP_METHODS else "other"


def multiprocess_dir() -> str | None:
    """The shared metrics directory when multi-process mode is on, else None."""
    return os.environ.get(MULTIPROC_ENV) or None


def solve_histogram(registry: CollectorRegistry | None) -> Histogram:
    """Solve durations by solver and outcome: one definition for the server and its solver processes."""
    return Histogram(
        "skrull_solve_duration_seconds",
        "Wall time of solving one job in a solver process, by solver and outcome (solved|failed).",
        ("solver", "status"),
        buckets=SOLVE_BUCKETS_S,
        registry=registry,
    )


class SolverMetrics:
    """What a solver process records itself in multi-process mode (nothing otherwise: its server does)."""

    def __init__(self) -> None:
        self.enabled = multiprocess_dir() is not None
        self.solve_seconds = solve_histogram(None) if self.enabled else None

    def solved(self, *, solver: str, outcome: str, seconds: float) -> bool:
        """Record one solve; True when it is recorded here (the server must then not count it again)."""
        if self.solve_seconds is None or outcome not in ("solved", "failed"):
            return False
        self.solve_seconds.labels(solver, outcome).observe(seconds)
        return True


class _Snapshot(Collector):
    """The families of one scrape: what the registries hold plus the gauges read just now."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterator[Metric]:
        yield from self.families


class Metrics:
    """Every metric the service exports, in a registry of this app's own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.solve_seconds = solve_histogram(r)
        self.http_seconds = Histogram(
            "skrull_http_request_duration_seconds",
            "HTTP request latency by route template, method and status code.",
            ("route", "method", "code"),
            buckets=HTTP_BUCKETS_S,
            registry=r,
        )
        self.submissions = Counter(
            "skrull_submissions_total",
            "Plan submissions by outcome (created|duplicate|requeued).",
            ("outcome",),
            registry=r,
        )
        self.plans_served = Counter(
            "skrull_plans_served_total",
            "Solved plans and rank views served, by kind (plan|rank_view).",
            ("kind",),
            registry=r,
        )
        self.errors = Counter(
            "skrull_errors_total", "Problem answers, by HTTP status and problem type.", ("status", "type"), registry=r
        )
        self.jobs_retried = Counter(
            "skrull_jobs_retried_total", "Jobs queued again after their solver process vanished.", registry=r
        )
        self.jobs_failed = Counter("skrull_jobs_failed_total", "Jobs failed, by reason.", ("reason",), registry=r)
        self.solver_restarts = Counter(
            "skrull_solver_restarts_total", "Solver processes restarted after dying.", registry=r
        )
        self.plans_deleted = Counter(
            "skrull_plans_deleted_total", "Plans deleted, by reason (request|expired).", ("reason",), registry=r
        )

    def render(self, *, jobs_by_status: Mapping[str, int], solver_processes: int, long_polls: int = 0) -> bytes:
        """The exposition of one scrape (text format 0.0.4), with the store's and the pool's state now."""
        shared = multiprocess_dir()
        if shared is not None:  # every process's files, this server's included
            source = CollectorRegistry()
            MultiProcessCollector(source, path=shared)  # type: ignore[no-untyped-call]
            families = list(source.collect())
        else:
            families = list(self.registry.collect())
        queue_depth = GaugeMetricFamily("skrull_queue_depth", "Jobs queued in the store, waiting for a solver process.")
        queue_depth.add_metric([], jobs_by_status.get("queued", 0))
        jobs = GaugeMetricFamily("skrull_jobs", "Jobs in the store by status.", labels=["status"])
        for status in JOB_STATUSES:
            jobs.add_metric([status], jobs_by_status.get(status, 0))
        live = GaugeMetricFamily("skrull_solver_processes", "Live solver processes of this server.")
        live.add_metric([], solver_processes)
        polls = GaugeMetricFamily("skrull_long_polls_waiting", "Long-polls waiting on this server now.")
        polls.add_metric([], long_polls)
        scrape = CollectorRegistry(auto_describe=False)
        scrape.register(_Snapshot([*families, queue_depth, jobs, live, polls]))
        return generate_latest(scrape)

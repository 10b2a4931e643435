"""Planners for service tests, loaded with ``SKRULL_PLUGINS=tests.api.plugin_planners``: a slow one (to
observe queues, progress and long-polls), ones whose process dies, and one that cannot place anything."""

from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path

from skrull.solver.errors import InfeasibleError
from skrull.solver.planners.base import PlannerOutput
from skrull.solver.planners.baselines import DeepSpeedPlanner
from skrull.solver.planners.registry import register
from skrull.solver.planners.skrull import SkrullPlanner
from skrull.solver.types import Problem

SLEEP_ENV = "SKRULL_TEST_SLEEP_S"
MARKER_ENV = "SKRULL_TEST_MARKER_DIR"
#: With this set to N, ``test-counted`` holds its first job until N solver processes each hold one, so a
#: test of several workers sees each of them take jobs however the machine's load staggers their starts.
QUORUM_ENV = "SKRULL_TEST_QUORUM"
#: The longest a held job waits for the quorum (its request's budget must give a longer hard limit).
QUORUM_WAIT_S = 30.0
#: With this naming a file, ``test-fails-later`` refuses its batch once the file exists (the test creates it
#: when it has seen the earlier iterations), instead of after a sleep.
FAIL_GATE_ENV = "SKRULL_TEST_FAIL_GATE"
#: The longest a gated planner waits for the test to open its gate (then it goes on, and the test has failed).
GATE_WAIT_S = 120.0


def wait_for(path: Path, *, timeout_s: float = GATE_WAIT_S) -> None:
    """Until ``path`` exists (a test's go-ahead), for at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def gate(marker_dir: str | Path, lengths: tuple[int, ...] | list[int]) -> Path:
    """The file that lets ``test-gated`` plan the batch of these sequence lengths."""
    return Path(marker_dir) / ("gate-" + "-".join(map(str, lengths)))


class SlowPlanner:
    """Skrull, after sleeping ``$SKRULL_TEST_SLEEP_S`` (default 0.3 s) per call; with
    ``$SKRULL_TEST_MARKER_DIR`` set, it creates ``slow-started`` there as its sleep begins."""

    name = "test-slow"
    #: Skrull after a sleep: streams as Skrull does
    streams_iterations = True

    def plan(self, problem: Problem) -> PlannerOutput:
        if MARKER_ENV in os.environ:
            (Path(os.environ[MARKER_ENV]) / "slow-started").touch()
        time.sleep(float(os.environ.get(SLEEP_ENV, "0.3")))
        return SkrullPlanner().plan(problem)


class CountedPlanner:
    """Skrull after sleeping ``$SKRULL_TEST_SLEEP_S`` (default 0.3 s), leaving one marker file per solve in
    ``$SKRULL_TEST_MARKER_DIR/solves`` named after the problem, so tests can count how often each job was
    solved."""

    name = "test-counted"
    #: solved whole
    streams_iterations = False

    def plan(self, problem: Problem) -> PlannerOutput:
        quorum = int(os.environ.get(QUORUM_ENV, "0"))
        if quorum:
            ready = Path(os.environ[MARKER_ENV]) / "ready"
            ready.mkdir(parents=True, exist_ok=True)
            (ready / str(os.getpid())).touch()
            deadline = time.monotonic() + QUORUM_WAIT_S
            while len(list(ready.iterdir())) < quorum and time.monotonic() < deadline:
                time.sleep(0.02)
        time.sleep(float(os.environ.get(SLEEP_ENV, "0.3")))
        key = hashlib.sha256(repr(problem.lengths).encode()).hexdigest()[:16]
        solves = Path(os.environ[MARKER_ENV]) / "solves"
        solves.mkdir(parents=True, exist_ok=True)
        (solves / f"{key}.{os.getpid()}.{time.monotonic_ns()}").write_text("solved")
        return SkrullPlanner().plan(problem)


class CrashPlanner:
    """Kills its own process, as an out-of-memory killer would."""

    name = "test-crash"
    #: solved whole
    streams_iterations = False

    def plan(self, problem: Problem) -> PlannerOutput:
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")


class CrashOncePlanner:
    """Kills its process the first time it sees a problem (a marker file remembers), then plans it."""

    name = "test-crash-once"
    #: solved whole
    streams_iterations = False

    def plan(self, problem: Problem) -> PlannerOutput:
        key = hashlib.sha256(repr(problem.lengths).encode()).hexdigest()[:16]
        marker = Path(os.environ[MARKER_ENV]) / key
        if not marker.exists():
            marker.write_text("crashed once")
            os.kill(os.getpid(), signal.SIGKILL)
        return SkrullPlanner().plan(problem)


class InfeasiblePlanner:
    name = "test-infeasible"
    #: solved whole
    streams_iterations = False

    def plan(self, problem: Problem) -> PlannerOutput:
        raise InfeasibleError(f"test planner refuses {len(problem.lengths)} sequences")


class InvalidPlanner:
    """A planner bug: places every sequence twice (the validator refuses the plan)."""

    name = "test-invalid"
    #: solved whole
    streams_iterations = False

    def plan(self, problem: Problem) -> PlannerOutput:
        output = SkrullPlanner().plan(problem)
        return PlannerOutput(iterations=tuple(specs + specs for specs in output.iterations))


class FailsLaterPlanner:
    """Skrull, streaming batch by batch, except that a batch holding a sequence of 13 tokens is refused after
    ``$SKRULL_TEST_SLEEP_S`` (default 0.3 s), or once the file ``$SKRULL_TEST_FAIL_GATE`` names exists: the
    plan fails after its earlier iterations were published."""

    name = "test-fails-later"
    streams_iterations = True

    def plan(self, problem: Problem) -> PlannerOutput:
        if 13 in problem.lengths:
            if FAIL_GATE_ENV in os.environ:
                wait_for(Path(os.environ[FAIL_GATE_ENV]))
            else:
                time.sleep(float(os.environ.get(SLEEP_ENV, "0.3")))
            raise InfeasibleError("test planner refuses a batch holding 13 tokens")
        return SkrullPlanner().plan(problem)


class StallsPlanner:
    """Skrull, streaming batch by batch, except that a batch holding a sequence of 13 tokens sleeps for
    ``$SKRULL_TEST_SLEEP_S`` (default 120 s): the batches before it are published at once, whatever the
    machine's load, and the solve then runs past any short hard limit."""

    name = "test-stalls"
    streams_iterations = True

    def plan(self, problem: Problem) -> PlannerOutput:
        if 13 in problem.lengths:
            time.sleep(float(os.environ.get(SLEEP_ENV, "120")))
        return SkrullPlanner().plan(problem)


class GatedPlanner:
    """Skrull, streaming batch by batch, each batch planned only once the test has created its ``gate`` file
    in ``$SKRULL_TEST_MARKER_DIR``: the test decides how far the solve has got, whatever the machine's load."""

    name = "test-gated"
    streams_iterations = True

    def plan(self, problem: Problem) -> PlannerOutput:
        wait_for(gate(os.environ[MARKER_ENV], problem.lengths))
        return SkrullPlanner().plan(problem)


class ForkedPlanner:
    """Skrull, after a forked child (the exact solvers' ``solver.ilp.runner``) has run for
    ``$SKRULL_TEST_SLEEP_S``: to observe that no solve's child outlives its solver process."""

    name = "test-forked"

    def plan(self, problem: Problem) -> PlannerOutput:
        from skrull.solver.ilp.runner import run_with_deadline

        def work(report: object, deadline: float) -> None:
            while time.monotonic() < deadline:
                sum(range(10_000))  # busy, as a solver is
                time.sleep(0.01)

        run_with_deadline(work, deadline=time.monotonic() + float(os.environ.get(SLEEP_ENV, "0.3")), grace_s=1.0)
        return SkrullPlanner().plan(problem)


class FlipPlanner:
    """Skrull the first time it sees a problem, one sequence per microbatch (DeepSpeed's plan) every later
    time (a marker file remembers): a resubmitted request then gets a different plan under the same id."""

    name = "test-flip"
    streams_iterations = False

    def plan(self, problem: Problem) -> PlannerOutput:
        key = hashlib.sha256(repr(problem.lengths).encode()).hexdigest()[:16]
        marker = Path(os.environ[MARKER_ENV]) / f"flip-{key}"
        if not marker.exists():
            marker.write_text("planned once")
            return SkrullPlanner().plan(problem)
        return DeepSpeedPlanner().plan(problem)


TEST_PLANNERS = (
    SlowPlanner,
    CountedPlanner,
    CrashPlanner,
    CrashOncePlanner,
    InfeasiblePlanner,
    InvalidPlanner,
    FailsLaterPlanner,
    StallsPlanner,
    GatedPlanner,
    FlipPlanner,
    ForkedPlanner,
)


def register_all() -> None:
    for cls in TEST_PLANNERS:
        register(cls.name, cls)


register_all()

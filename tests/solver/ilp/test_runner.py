"""The budget keeper: a late solve is killed at its deadline and its last incumbent is kept."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from skrull.solver.ilp.runner import Work, run_with_deadline, start_child

#: A deadline the child's two reports surely beat on a loaded machine, far short of its 30 s sleep.
REPORTS_IN_TIME_S = 5.0


def _slow(report: Any, deadline: float) -> str:
    report("first")
    report("second")
    time.sleep(30)
    return "never"


def _quick(report: Any, deadline: float) -> str:
    report("draft")
    return "final"


def _broken(report: Any, deadline: float) -> str:
    report("partial")
    raise RuntimeError("solver crashed")


def test_kills_a_late_child_and_keeps_the_last_incumbent() -> None:
    start = time.monotonic()
    outcome = run_with_deadline(_slow, deadline=start + REPORTS_IN_TIME_S, grace_s=0.1)
    assert outcome.killed and outcome.payload == "second"
    assert time.monotonic() - start < 25.0  # killed, not waited out (it sleeps 30 s); any load passes this


def test_returns_the_final_answer_when_in_time() -> None:
    outcome = run_with_deadline(_quick, deadline=time.monotonic() + 5)
    assert not outcome.killed and outcome.payload == "final"


def test_reports_a_crash_with_the_last_incumbent() -> None:
    outcome = run_with_deadline(_broken, deadline=time.monotonic() + 5)
    assert outcome.payload == "partial" and outcome.error is not None and "solver crashed" in outcome.error


def test_a_started_child_runs_while_the_parent_works_and_streams_every_report() -> None:
    start = time.monotonic()
    child = start_child(_slow, deadline=start + REPORTS_IN_TIME_S)
    busy = sum(i * i for i in range(10_000))  # the parent's own work meanwhile
    seen: list[str] = []
    outcome = child.collect(deadline=start + REPORTS_IN_TIME_S, grace_s=0.0, on_report=seen.append)
    assert busy > 0 and seen == ["first", "second"]
    assert outcome.killed and outcome.payload == "second"
    assert time.monotonic() - start < 25.0  # killed, not waited out (it sleeps 30 s)


def _answers_once(go: Path) -> Work:
    """Reports, then answers only once ``go`` exists: the test decides when, whatever the machine's load."""

    def work(report: Any, deadline: float) -> str:
        report("early")
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return "late answer"

    return work


def test_read_takes_what_was_sent_and_leaves_the_child_running_for_a_later_collect(tmp_path: Path) -> None:
    go = tmp_path / "go"
    start = time.monotonic()
    child = start_child(_answers_once(go), deadline=start + 120)
    seen: list[str] = []
    while not seen and time.monotonic() < start + 120:  # short reads until the report came
        assert child.read(until=time.monotonic() + 0.1, on_report=seen.append) is None  # running, not killed
    assert seen == ["early"]
    go.touch()
    outcome = child.collect(deadline=start + 120, grace_s=0.0, on_report=seen.append)
    assert not outcome.killed and outcome.payload == "late answer"
    assert seen == ["early"]  # each report is passed once


def test_read_returns_the_answer_once_the_child_has_given_it() -> None:
    child = start_child(_quick, deadline=time.monotonic() + 60)
    outcome = child.read(until=time.monotonic() + 60)
    assert outcome is not None and outcome.payload == "final" and not outcome.killed
    assert child.collect(deadline=time.monotonic(), grace_s=0.0) == outcome

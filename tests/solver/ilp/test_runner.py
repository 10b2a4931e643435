"""The budget keeper: a late solve is killed at its deadline and its last incumbent is kept."""

from __future__ import annotations

import time
from typing import Any

from skrull.solver.ilp.runner import run_with_deadline, start_child


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
    outcome = run_with_deadline(_slow, deadline=start + 0.5, grace_s=0.1)
    assert outcome.killed and outcome.payload == "second"
    assert time.monotonic() - start < 20.0  # killed, not waited out (it sleeps 30 s); any load passes this


def test_returns_the_final_answer_when_in_time() -> None:
    outcome = run_with_deadline(_quick, deadline=time.monotonic() + 5)
    assert not outcome.killed and outcome.payload == "final"


def test_reports_a_crash_with_the_last_incumbent() -> None:
    outcome = run_with_deadline(_broken, deadline=time.monotonic() + 5)
    assert outcome.payload == "partial" and outcome.error is not None and "solver crashed" in outcome.error


def test_a_started_child_runs_while_the_parent_works_and_streams_every_report() -> None:
    start = time.monotonic()
    child = start_child(_slow, deadline=start + 0.5)
    busy = sum(i * i for i in range(10_000))  # the parent's own work meanwhile
    seen: list[str] = []
    outcome = child.collect(deadline=start + 0.5, grace_s=0.0, on_report=seen.append)
    assert busy > 0 and seen == ["first", "second"]
    assert outcome.killed and outcome.payload == "second"
    assert time.monotonic() - start < 20.0  # killed, not waited out (it sleeps 30 s)


def _then_answers(report: Any, deadline: float) -> str:
    report("early")
    time.sleep(2.0)  # long after the parent's first read, whatever the machine's load
    return "late answer"


def test_read_takes_what_was_sent_and_leaves_the_child_running_for_a_later_collect() -> None:
    start = time.monotonic()
    child = start_child(_then_answers, deadline=start + 60)
    seen: list[str] = []
    assert child.read(until=start + 1.0, on_report=seen.append) is None  # still running, not killed
    assert seen == ["early"]
    outcome = child.collect(deadline=start + 60, grace_s=0.0, on_report=seen.append)
    assert not outcome.killed and outcome.payload == "late answer"
    assert seen == ["early"]  # each report is passed once


def test_read_returns_the_answer_once_the_child_has_given_it() -> None:
    child = start_child(_quick, deadline=time.monotonic() + 60)
    outcome = child.read(until=time.monotonic() + 60)
    assert outcome is not None and outcome.payload == "final" and not outcome.killed
    assert child.collect(deadline=time.monotonic(), grace_s=0.0) == outcome

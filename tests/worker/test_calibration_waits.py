"""A microbatch's measured time is the group's from when it is together: a member that arrives early and
waits inside the first collective does not charge that wait (the other members' earlier microbatches) to
this microbatch."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from skrull.worker.calibration import Calibration, RankTiming, measured_microbatches

START = "h100-80g/qwen2.5-0.5b"

#: one microbatch of a simulated iteration on the group (0, 1): communicating (sharded, both members held
#: by its collectives) with its true time, or local only with each member's own time (0: an empty part)
Microbatch = tuple[bool, float, float]


def _timings(iteration: int, microbatches: list[Microbatch]) -> list[RankTiming]:
    """What each rank's timer reads when the group runs ``microbatches`` in step order, both ranks starting
    the iteration together: a communicating microbatch starts when its last member arrives (the early one's
    timer runs while it waits) and ends at once on both; a local-only one runs each part on its own."""
    clock = [0.0, 0.0]
    out = []
    for step, (communicates, a, b) in enumerate(microbatches):
        if communicates:
            together = max(clock)
            ends = [together + a, together + a]
        else:
            ends = [clock[0] + a, clock[1] + b]
        for position in (0, 1):
            out.append(
                RankTiming(
                    iteration=iteration, step=step, ranks=(0, 1), position=position,
                    local_lengths=(8,) if not communicates and (a, b)[position] > 0 else (),
                    sharded_lengths=(300,) if communicates else (), ms=ends[position] - clock[position],
                )
            )  # fmt: skip
        clock = ends
    return out


def _true_ms(mb: Microbatch) -> float:
    communicates, a, b = mb
    return a if communicates else max(a, b)


def test_the_first_sharded_microbatch_after_local_ones_is_not_charged_the_wait() -> None:
    # GPU 0 runs two local microbatches (30 and 40 ms) while GPU 1, with empty parts, goes straight on to the
    # sharded microbatch and waits in its all-gather; the sharded microbatch itself takes 10 ms
    plan: list[Microbatch] = [(False, 30.0, 0.0), (False, 40.0, 0.0), (True, 10.0, 10.0), (True, 12.0, 12.0)]
    rows = _timings(0, plan)
    assert max(r.ms for r in rows if r.step == 2) == 80.0  # what GPU 1's timer read: the wait and the work
    assert [mb.ms for mb in measured_microbatches(rows)] == [30.0, 40.0, 10.0, 12.0]


microbatches = st.lists(
    st.tuples(
        st.booleans(),
        st.floats(min_value=0.0, max_value=500.0, allow_nan=False),
        st.floats(min_value=0.0, max_value=500.0, allow_nan=False),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(microbatches, min_size=1, max_size=3))
def test_every_microbatch_measures_its_own_time_whatever_the_members_waited(
    iterations: list[list[Microbatch]],
) -> None:
    rows = [r for it, mbs in enumerate(iterations) for r in _timings(it, mbs)]
    measured = measured_microbatches(rows)
    assert [(mb.iteration, mb.step) for mb in measured] == [
        (it, step) for it, mbs in enumerate(iterations) for step in range(len(mbs))
    ]
    expected = [_true_ms(mb) for mbs in iterations for mb in mbs]
    for mb, want in zip(measured, expected, strict=True):
        assert abs(mb.ms - want) <= 1e-9 * max(1.0, want), (mb, want)


def test_a_long_run_keeps_whole_iterations_so_no_start_loses_its_earlier_parts(monkeypatch: Any) -> None:
    monkeypatch.setattr(Calibration, "MAX_TIMINGS", 6)
    calibration = Calibration(START)
    plan: list[Microbatch] = [(False, 30.0, 0.0), (True, 10.0, 10.0)]  # 4 rank timings an iteration
    for iteration in range(3):
        calibration.add(_timings(iteration, plan))
    # 12 timings, the latest 6 hold iteration 1's sharded microbatch without its local one: dropped whole, else
    # both members' starts would be 0 and it would read GPU 1's wait for GPU 0's local part (40 ms, not 10)
    assert [(mb.iteration, mb.ms) for mb in calibration.microbatches] == [(2, 30.0), (2, 10.0)]

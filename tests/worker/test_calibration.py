"""Calibration from the run: the refit recovers a machine's cost model from microbatch timings (warm-up and
outliers included), writes an ordinary profile with its provenance, and the loader plans later requests
with it."""

from __future__ import annotations

import dataclasses
import random
import re
import time
from typing import Any

import pytest

from examples.train_tiny import TINY_PROFILE, make_dataset
from skrull.solver.cost import CostModel
from skrull.solver.profile import load_profile, profile_from_dict
from skrull.worker.calibration import (
    HALF_LIFE_ITERATIONS,
    MIN_COMMUNICATING,
    Calibration,
    MeasuredMicrobatch,
    RankTiming,
    fit_profile,
    measured_microbatches,
    median_error,
)
from skrull.worker.dataloader import PlannedBatches
from skrull.worker.profiling.fit import FitError

START = "h100-80g/qwen2.5-0.5b"
#: a "CPU": 1000x slower compute, slow communication, a large per-microbatch overhead
TRUTH = {
    "name": "cpu/truth",
    "compute": {"flops_per_token": 1.189e9, "flops_per_token_sq": 258048, "ms_per_tflop": 3300.0, "fixed_ms": 0.0},
    "comm": {"bytes_per_token": 24576, "ms_per_mib": 0.5, "fixed_ms": 4.0},
    "memory": {"bucket_tokens": 4096},
    "microbatch_ms": 30.0,
}


def _microbatches(rng: random.Random, count: int, *, first_iteration: int = 0) -> list[MeasuredMicrobatch]:
    truth = CostModel(profile_from_dict(TRUTH))
    out = []
    for k in range(count):
        n = rng.choice([1, 2, 2, 4])
        local = tuple(tuple(rng.randint(16, 900) for _ in range(rng.randint(0, 3))) for _ in range(n))
        sharded = tuple(rng.randint(500, 3000) for _ in range(rng.randint(0, 2))) if n > 1 else ()
        if not any(local) and not sharded:
            local = ((64,), *local[1:])
        ms = truth.microbatch_time_ms(local, sharded) * rng.uniform(0.97, 1.03)
        out.append(
            MeasuredMicrobatch(
                iteration=first_iteration + k // 4,
                step=k % 4,
                ranks=tuple(range(n)),
                local=local,
                sharded=sharded,
                ms=ms,
            )
        )
    return out


def test_the_refit_recovers_the_machine_despite_warm_up_and_outliers() -> None:
    rng = random.Random(5)
    data = _microbatches(rng, 80)
    warm = [
        MeasuredMicrobatch(iteration=-1, step=s, ranks=(0,), local=((100,),), sharded=(), ms=5000.0) for s in range(4)
    ]
    spikes = [MeasuredMicrobatch(**{**{f: getattr(mb, f) for f in mb.__slots__}, "ms": mb.ms * 6}) for mb in data[:3]]
    fit = fit_profile(load_profile(START), warm + spikes + data[3:], provenance={"device": "test"})
    model = CostModel(profile_from_dict(fit.profile))
    fresh = _microbatches(random.Random(6), 40)
    assert median_error(fresh, model) < 0.10  # out of sample
    assert median_error(fresh, CostModel(load_profile(START))) > 0.9  # the H100 profile is far off
    assert fit.dropped >= 3
    cal = fit.profile["calibrated"]
    assert cal["from"] == START and cal["microbatches"] == fit.used and cal["device"] == "test"
    assert -1 not in cal["iterations"]  # the warm-up iteration is left out
    assert "check" not in fit.profile and fit.profile["memory"]["bucket_tokens"] == 26000


def test_communication_the_run_never_showed_is_scaled_from_the_starting_profile_not_fitted_to_zero() -> None:
    data = [mb for mb in _microbatches(random.Random(7), 120) if not mb.sharded][:40]
    fit = fit_profile(load_profile(START), data)
    start = load_profile(START)
    ratio = fit.profile["compute"]["ms_per_tflop"] / start.compute.ms_per_tflop
    assert ratio > 100  # the "CPU" is far slower
    assert fit.profile["comm"]["fixed_ms"] == pytest.approx(start.comm.fixed_ms * ratio)
    assert fit.profile["comm"]["ms_per_mib"] == pytest.approx(start.comm.ms_per_mib * ratio)
    assert "starting profile" in fit.profile["comm"]["source"]
    few = [dataclasses.replace(mb, iteration=99) for mb in _microbatches(random.Random(8), 200) if mb.sharded][:2]
    with_few = fit_profile(load_profile(START), data + few)
    assert with_few.profile["comm"]["fixed_ms"] != pytest.approx(start.comm.fixed_ms * ratio)  # what they showed
    assert median_error(few, CostModel(profile_from_dict(with_few.profile))) < median_error(
        few, CostModel(profile_from_dict(fit.profile))
    )


def test_the_fit_follows_a_machine_that_slowed_down_rather_than_its_average() -> None:
    """Twenty iterations, the last ten on a machine twice as slow (another job arrived): the next iteration
    runs on the slow one, and the recency-weighted fit predicts it; weighing every iteration alike predicts
    the average machine, a third too fast."""
    data = _microbatches(random.Random(9), 80)
    slow = [dataclasses.replace(mb, ms=2.0 * mb.ms) for mb in _microbatches(random.Random(10), 80, first_iteration=20)]
    history = data + slow
    upcoming = [dataclasses.replace(mb, ms=2.0 * mb.ms) for mb in _microbatches(random.Random(11), 40)]
    recent = CostModel(profile_from_dict(fit_profile(load_profile(START), history).profile))
    flat = CostModel(profile_from_dict(fit_profile(load_profile(START), history, half_life_iterations=None).profile))
    assert median_error(upcoming, recent) < 0.10
    assert median_error(upcoming, flat) > 0.20
    assert (
        fit_profile(load_profile(START), history).profile["calibrated"]["half_life_iterations"] == HALF_LIFE_ITERATIONS
    )
    with pytest.raises(ValueError, match="half_life_iterations"):
        fit_profile(load_profile(START), history, half_life_iterations=0.0)


def test_a_few_communicating_microbatches_refit_communication_only_as_far_as_they_weigh() -> None:
    """Communicating microbatches whose times show no communication at all (noise can hide it): four weigh
    as much as the scaled starting communication, so it stays at least half of that, never free; a hundred
    and twenty outweigh it and bring the fixed cost near zero."""
    free = CostModel(profile_from_dict({**TRUTH, "comm": {**TRUTH["comm"], "ms_per_mib": 0.0, "fixed_ms": 0.0}}))
    lone = [mb for mb in _microbatches(random.Random(13), 200) if not mb.sharded][:40]
    rng = random.Random(12)

    def comm(count: int) -> dict[str, Any]:
        sharded = []
        for k in range(count):
            mb = MeasuredMicrobatch(iteration=1 + k // 4, step=10 + k % 4, ranks=(0, 1), local=((), ()),
                                    sharded=(rng.randint(500, 3000),), ms=0.0)  # fmt: skip
            sharded.append(dataclasses.replace(mb, ms=free.microbatch_time_ms(mb.local, mb.sharded)))
        doc = fit_profile(load_profile(START), lone + sharded, half_life_iterations=None).profile
        return dict(doc["comm"])

    scaled = comm(0)  # none communicated: the starting communication, scaled by the compute's ratio
    few, many = comm(MIN_COMMUNICATING), comm(30 * MIN_COMMUNICATING)
    for term in ("ms_per_mib", "fixed_ms"):  # 0.45: the compute's ratio moves a little between the fits
        assert few[term] >= 0.45 * scaled[term] and many[term] < few[term]
    assert many["fixed_ms"] < 0.1 * scaled["fixed_ms"]
    assert "4 microbatches weighing 50%" in few["source"] and "120 microbatches weighing 97%" in many["source"]
    assert scaled["ms_per_mib"] > load_profile(START).comm.ms_per_mib  # the "CPU" is slower at all of it


def test_too_few_microbatches_refuse_to_fit_and_keep_the_previous_profile() -> None:
    with pytest.raises(FitError, match="at least"):
        fit_profile(load_profile(START), _microbatches(random.Random(1), 6))
    cal = Calibration(START)
    assert cal.refit() is None


def test_rank_parts_make_one_microbatch_timed_by_its_slowest_member() -> None:
    parts = [
        RankTiming(
            iteration=0, step=0, ranks=(2, 3), position=p, local_lengths=(10 * (p + 1),), sharded_lengths=(99,), ms=ms
        )
        for p, ms in ((0, 5.0), (1, 7.0))
    ]
    lone = RankTiming(iteration=0, step=1, ranks=(0, 1), position=0, local_lengths=(5,), sharded_lengths=(), ms=1.0)
    (mb,) = measured_microbatches([*parts, lone])  # the other member of step 1 did not report: left out
    assert mb.local == ((10,), (20,)) and mb.sharded == (99,) and mb.ms == 7.0
    assert RankTiming.from_list(parts[0].to_list()) == parts[0]


def test_the_loader_plans_later_requests_with_the_calibrated_profile() -> None:
    dataset = make_dataset(96, max_tokens=64, seed=3)
    loader = PlannedBatches(
        dataset, [len(s) for s in dataset], global_batch_size=8, profile=TINY_PROFILE, seed=3, rank=0, dp=1, cp=1,
        calibrate=True, plan_ahead=1, num_iterations=10,
    )  # fmt: skip
    profiles = []
    for ready in loader:
        fake = [1.0 + 0.01 * mb.num_tokens for mb in ready.microbatches]  # a "machine": 1 ms + 10 us per token
        report = loader.record_timings(ready, fake)
        profiles.append(report.profile)
        time.sleep(0.01)
    assert loader.calibration is not None
    line = loader.calibration.summary_line()
    fitted = loader.calibration.fitted_profile()
    loader.close()
    assert profiles[0] == TINY_PROFILE["name"] and profiles[-1].endswith("+calibrated")
    assert fitted is not None and fitted["calibrated"]["microbatches"] >= 6
    assert re.fullmatch(
        r"calibration: median microbatch error \d+\.\d% -> \d+\.\d% over \d+ microbatches; "
        r"iteration estimate error \d+\.\d% -> \d+\.\d%",
        line,
    )
    after = float(line.split("-> ")[1].split("%")[0])
    assert after < 5.0  # a noiseless machine is learnt exactly

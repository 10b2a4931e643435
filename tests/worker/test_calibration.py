"""Calibration from the run: the refit recovers a machine's cost model from microbatch timings (warm-up and
outliers included), writes an ordinary profile with its provenance, and the loader plans later requests
with it."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
import statistics
import time
from typing import Any

import pytest

from examples.train_tiny import TINY_PROFILE, make_dataset
from skrull.solver.cost import CostModel
from skrull.solver.profile import Profile, load_profile, profile_from_dict
from skrull.worker import calibration
from skrull.worker.calibration import (
    MIN_COMMUNICATING,
    Calibration,
    MeasuredMicrobatch,
    RankTiming,
    fit_profile,
    measured_microbatches,
    median_error,
    noise_floor,
)
from skrull.worker.dataloader import PlannedBatches
from skrull.worker.loader_options import LoaderOptions
from skrull.worker.profiling.fit import FitError

START = "h100-80g/qwen2.5-0.5b"


def _start() -> Profile:
    """The bundled H100 profile priced as the contract's reference: one bandwidth per collective, overlap
    with all local compute, no gathered K/V (the truths below are written in that form; the topology case
    adds its own links)."""
    doc = load_profile(START).to_dict()
    for section in ("topology", "overlap"):
        doc.pop(section, None)
    for key in ("kv_bytes_per_token", "gathered_kv"):
        doc["memory"].pop(key, None)
    return profile_from_dict(doc)


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
    fit = fit_profile(_start(), warm + spikes + data[3:], provenance={"device": "test"})
    model = CostModel(profile_from_dict(fit.profile))
    fresh = _microbatches(random.Random(6), 40)
    assert median_error(fresh, model) < 0.10  # out of sample
    assert median_error(fresh, CostModel(_start())) > 0.9  # the H100 profile is far off
    assert fit.dropped >= 3
    cal = fit.profile["calibrated"]
    assert cal["from"] == START and cal["microbatches"] == fit.used and cal["device"] == "test"
    assert -1 not in cal["iterations"]  # the warm-up iteration is left out
    assert "check" not in fit.profile and fit.profile["memory"]["bucket_tokens"] == 26000


def test_communication_the_run_never_showed_keeps_the_starting_value_unscaled_and_says_so() -> None:
    data = [mb for mb in _microbatches(random.Random(7), 120) if not mb.sharded][:40]
    fit = fit_profile(_start(), data)
    start = _start()
    assert fit.profile["compute"]["ms_per_tflop"] / start.compute.ms_per_tflop > 100  # the "CPU" is far slower
    assert fit.profile["comm"]["ms_per_mib"] == start.comm.ms_per_mib  # never scaled by the compute's ratio
    assert fit.profile["comm"]["fixed_ms"] == start.comm.fixed_ms
    assert fit.profile["comm_a2a"]["ms_per_mib"] == start.comm_a2a.ms_per_mib  # type: ignore[union-attr]
    assert set(fit.kept) == {"comm.*", "comm_a2a.*"} and fit.profile["calibrated"]["kept_starting"] == fit.kept
    few = [dataclasses.replace(mb, iteration=9) for mb in _microbatches(random.Random(8), 200) if mb.sharded]
    with_few = fit_profile(_start(), data + few[: MIN_COMMUNICATING - 1])
    assert with_few.profile["comm"]["ms_per_mib"] == start.comm.ms_per_mib
    assert "fewer than" in with_few.kept["comm.ms_per_mib"] and "fewer than" in with_few.kept["comm.fixed_ms"]
    assert "kept from" in with_few.profile["comm"]["source"]


#: the truth of the separate fits: a machine whose collectives cost a few seconds per microbatch, the
#: all-to-all a quarter of the all-gather's per MiB (one coefficient scaled from the other would miss it)
TRUTH_BOTH = {
    **TRUTH,
    "heads": {"attention": 14, "kv": 2},
    "comm": {"bytes_per_token": 24576, "ms_per_mib": 20.0, "fixed_ms": 40.0},
    "comm_a2a": {"bytes_per_token": 196608, "kv_bytes_per_token": 24576, "ms_per_mib": 5.0, "fixed_ms": 60.0},
}


def _mixed(rng: random.Random, count: int, truth: dict[str, Any], *, spread: float = 0.03) -> list[MeasuredMicrobatch]:
    """Microbatches of both modes on groups of 2, timed by ``truth``'s model (compute, all-gather, all-to-all)."""
    model = CostModel(profile_from_dict(truth))
    out = []
    for k in range(count):
        mode = ("allgather", "ulysses", None)[k % 3]
        n = 2 if mode else rng.choice([1, 2])
        # DACP's usual sharded microbatch holds its long sequences alone: the communication shows
        local = tuple(tuple(rng.randint(16, 900) for _ in range(0 if mode else rng.randint(0, 2))) for _ in range(n))
        sharded = tuple(rng.randint(500, 6000) for _ in range(rng.randint(1, 2))) if mode else ()
        if not any(local) and not sharded:
            local = ((64,), *local[1:])
        ms = model.microbatch_time_ms(local, sharded, mode or "allgather") * rng.uniform(1 - spread, 1 + spread)
        out.append(MeasuredMicrobatch(iteration=k // 4, step=k % 4, ranks=tuple(range(n)), local=local,
                                      sharded=sharded, ms=ms, mode=mode or "allgather"))  # fmt: skip
    return out


def test_all_gather_and_all_to_all_are_fitted_separately() -> None:
    """Both collectives recovered each with its own coefficient, from one run that ran both (no compute ratio,
    no shared term); the microbatches' times then follow the fit."""
    data = _mixed(random.Random(21), 150, TRUTH_BOTH)
    fit = fit_profile(_start(), data, half_life_iterations=None)
    comm, a2a = fit.profile["comm"], fit.profile["comm_a2a"]
    assert not fit.kept
    assert comm["ms_per_mib"] == pytest.approx(20.0, rel=0.15) and a2a["ms_per_mib"] == pytest.approx(5.0, rel=0.15)
    assert fit.profile["memory"]["bucket_tokens"] == 26000 and fit.profile["heads"]["attention"] == 14
    assert median_error(_mixed(random.Random(22), 60, TRUTH_BOTH), CostModel(profile_from_dict(fit.profile))) < 0.08


def test_with_a_topology_the_fitted_link_is_the_one_the_run_used_and_the_rest_is_kept() -> None:
    start = _start().to_dict()
    start["topology"] = {
        "gpus_per_node": 8,
        "intra_node": {"allgather_ms_per_mib": 0.0027, "alltoall_ms_per_mib": 0.0031},
        "inter_node": {"allgather_ms_per_mib": 0.0208, "alltoall_ms_per_mib": 0.0227},
        "source": "published",
    }
    start["memory"] = {**start["memory"], "activation_bytes_per_token": 786432, "kv_bytes_per_token": 24576}
    truth = dict(TRUTH_BOTH)
    # the truth's link as the contract prices it with a topology: (N-1)/N of the traffic, N = 2
    truth["comm"] = {**TRUTH_BOTH["comm"], "ms_per_mib": 10.0}
    truth["comm_a2a"] = {**TRUTH_BOTH["comm_a2a"], "ms_per_mib": 2.5}
    data = _mixed(random.Random(23), 150, truth)
    fit = fit_profile(profile_from_dict(start), data, half_life_iterations=None)
    topo = fit.profile["topology"]
    assert topo["intra_node"]["allgather_ms_per_mib"] == pytest.approx(20.0, rel=0.15)  # 10 / ((N-1)/N)
    assert topo["intra_node"]["alltoall_ms_per_mib"] == pytest.approx(5.0, rel=0.15)
    assert topo["inter_node"] == start["topology"]["inter_node"]  # the run never crossed a node
    assert "topology.intra_node.allgather_ms_per_mib: calibrated" in topo["source"]
    assert fit.profile["memory"]["kv_bytes_per_token"] == 24576


def test_too_few_microbatches_refuse_to_fit_and_keep_the_previous_profile() -> None:
    with pytest.raises(FitError, match="at least"):
        fit_profile(_start(), _microbatches(random.Random(1), 6))
    cal = Calibration(START)
    assert cal.refit() is None


def test_rank_parts_make_one_microbatch_timed_by_its_slowest_member() -> None:
    assert RankTiming.from_list([0, 0, [0], 0, [5], [], 1.0]).mode == "allgather"  # rows of before the mode
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
    ulysses = dataclasses.replace(parts[0], mode="ulysses")
    assert RankTiming.from_list(ulysses.to_list()) == ulysses


def test_the_loader_plans_later_requests_with_the_calibrated_profile() -> None:
    dataset = make_dataset(96, max_tokens=64, seed=3)
    loader = PlannedBatches(
        dataset,
        [len(s) for s in dataset],
        LoaderOptions(
            global_batch_size=8, profile=TINY_PROFILE, seed=3, rank=0, dp=1, cp=1, calibrate=True, plan_ahead=1,
            num_iterations=10
        ),
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


def test_a_fixed_cost_the_run_cannot_tell_from_the_per_mib_one_keeps_its_start() -> None:
    """Sharded microbatches of nearly one size: the fixed cost stays the starting one (said in the log and
    the profile) and the per-MiB coefficient takes the time, as the bandwidth a planner scales by."""
    start = _start()
    truth = {**TRUTH_BOTH, "comm": {**TRUTH_BOTH["comm"], "fixed_ms": start.comm.fixed_ms}}
    data = [
        dataclasses.replace(mb, sharded=(1000 + mb.sharded[0] % 300,)) if mb.sharded else mb
        for mb in _mixed(random.Random(24), 150, truth)
        if mb.mode == "allgather"
    ]
    model = CostModel(profile_from_dict(truth))
    data = [dataclasses.replace(mb, ms=model.microbatch_time_ms(mb.local, mb.sharded)) for mb in data]
    fit = fit_profile(start, data, half_life_iterations=None)
    assert "varied too little" in fit.kept["comm.fixed_ms"] and fit.profile["comm"]["fixed_ms"] == start.comm.fixed_ms
    assert fit.profile["comm"]["ms_per_mib"] == pytest.approx(20.0, rel=0.05)


def test_rows_follow_the_overlap_per_direction_near_the_crossover() -> None:
    """With ``overlap`` in the profile the worker hides forward's exchange behind forward's local attention and
    backward's behind backward's (solver/cost.py prices the two ``max``); near the crossover, where one
    direction's exchange shows and the other's hides, only rows of that form recover the truth."""
    overlap = {"with": "local_attention", "ulysses_exposed": 0.5, "source": "worker/dacp.py"}
    truth = {**TRUTH_BOTH, "overlap": overlap}
    model = CostModel(profile_from_dict(truth))
    rng = random.Random(31)
    data = []
    for k in range(180):
        mode = ("allgather", "ulysses", "allgather")[k % 3]
        # local attention of 600-1,400 tokens against 1,000-3,000 sharded tokens: comparable times; one in
        # three microbatches keeps its sequences whole (as a plan's local-only ones do)
        local = tuple((rng.randint(600, 1400),) for _ in range(2))
        sharded = (rng.randint(1000, 3000),) if k % 3 < 2 else ()
        ms = model.microbatch_time_ms(local, sharded, mode)  # exact: the single max's rows miss by 0.35%
        data.append(MeasuredMicrobatch(iteration=k // 4, step=k % 4, ranks=(0, 1), local=local, sharded=sharded,
                                       ms=ms, mode=mode))  # fmt: skip
    start = profile_from_dict({**_start().to_dict(), "overlap": overlap})
    fit = fit_profile(start, data, half_life_iterations=None)
    fitted = CostModel(profile_from_dict(fit.profile))
    assert not fit.kept, fit.kept
    assert fit.profile["comm"]["ms_per_mib"] == pytest.approx(20.0, rel=1e-6)
    assert fit.profile["comm"]["fixed_ms"] == pytest.approx(40.0, rel=1e-6)
    assert fit.profile["comm_a2a"]["ms_per_mib"] == pytest.approx(5.0, rel=1e-6)
    assert fit.profile["comm_a2a"]["fixed_ms"] == pytest.approx(60.0, rel=1e-6)
    assert median_error(data, fitted) < 1e-6


def test_the_noise_floor_is_zero_on_exact_timings_and_finds_whole_iterations_run_at_other_speeds() -> None:
    """Exact timings leave nothing unexplained; whole iterations run at speeds 0.8-1.25x (what a shared machine
    does to them) leave an in-sample floor no coefficient removes, near the spread put in."""
    truth = CostModel(profile_from_dict(TRUTH))
    exact = [
        dataclasses.replace(mb, ms=truth.microbatch_time_ms(mb.local, mb.sharded))  # the model's own times
        for mb in _microbatches(random.Random(11), 100)
    ]
    floor = noise_floor(_start(), exact)
    assert floor is not None and floor.microbatch_error < 1e-3 and floor.iteration_error < 1e-3
    speeds = (0.8, 0.9, 1.0, 1.1, 1.25)
    uneven = [dataclasses.replace(mb, ms=mb.ms * speeds[mb.iteration % len(speeds)]) for mb in exact]
    floor = noise_floor(_start(), uneven)
    assert floor is not None
    # fitted to the typical speed (1.0), the iterations miss by 0-25%: a median about 10%
    assert 0.05 < floor.iteration_error < 0.2 and 0.05 < floor.microbatch_error < 0.2
    assert floor.microbatches == len([mb for mb in uneven if mb.iteration >= 1])  # the warm-up left out
    assert floor.iterations == 24 and not floor.optimistic
    assert re.fullmatch(
        r"calibration noise floor: \d+\.\d% per microbatch, \d+\.\d% per iteration \(the model's \d "
        r"coefficients fitted to this run's 96 microbatches of 24 iterations .*\)",
        floor.line(),
    )
    assert noise_floor(_start(), exact[:3]) is None  # too few to fit


def _noisy(rng: random.Random, count: int) -> list[MeasuredMicrobatch]:
    """The truth's own times with 10% noise per iteration and 12% per microbatch (log-normal): the model's
    form exactly right, the machine noisy."""
    truth = CostModel(profile_from_dict(TRUTH))
    speed: dict[int, float] = {}
    return [
        dataclasses.replace(
            mb,
            ms=truth.microbatch_time_ms(mb.local, mb.sharded)
            * speed.setdefault(mb.iteration, math.exp(rng.gauss(0, 0.10)))
            * math.exp(rng.gauss(0, 0.12)),
        )
        for mb in _microbatches(rng, count)
    ]


def test_the_noise_floor_of_a_right_model_is_the_noise_and_a_short_run_says_it_is_optimistic() -> None:
    """With the form right, the floor of a long run is what the true coefficients themselves miss; a short run
    fits its noise with its coefficients (in sample), so its floor is lower and the line says so."""
    truth = CostModel(profile_from_dict(TRUTH))
    floors, true_errors = [], []
    for seed in range(8):
        data = _noisy(random.Random(seed), 124)
        floor = noise_floor(_start(), data)
        assert floor is not None and not floor.optimistic
        floors.append(floor.microbatch_error)
        true_errors.append(median_error([mb for mb in data if mb.iteration >= 1], truth))
    assert abs(statistics.median(floors) - statistics.median(true_errors)) < 0.02
    short = noise_floor(_start(), _noisy(random.Random(3), 12))  # 8 microbatches after warm-up, 2 iterations
    assert short is not None and short.optimistic and "optimistic" in short.line()


def test_a_record_reads_back_as_the_measured_microbatch_it_was() -> None:
    for mb in _microbatches(random.Random(21), 40):
        mb = dataclasses.replace(mb, mode="ulysses" if mb.step % 2 else "allgather")
        record = mb.to_record("h100-80g/qwen2.5-0.5b+calibrated")
        assert MeasuredMicrobatch.from_record(json.loads(json.dumps(record))) == mb
        assert record["profile"] == "h100-80g/qwen2.5-0.5b+calibrated"


@pytest.mark.parametrize("bad_ms", [math.inf, math.nan, 5e-324, 0.0, -3.0])
def test_a_timing_that_is_no_measurement_is_left_out_of_every_fit(bad_ms: float) -> None:
    """Infinite, denormal (it made the least squares fail to converge), zero or negative timings: left out,
    the fit and the noise floor as without them, never an exception that would stop a training run."""
    data = _microbatches(random.Random(23), 120)
    spoiled = [dataclasses.replace(mb, ms=bad_ms) if k % 13 == 0 else mb for k, mb in enumerate(data)]
    clean = [mb for k, mb in enumerate(data) if k % 13]
    assert fit_profile(_start(), spoiled).profile["compute"] == fit_profile(_start(), clean).profile["compute"]
    assert noise_floor(_start(), spoiled) == noise_floor(_start(), clean)


def test_the_noise_floor_of_a_long_run_is_fitted_on_its_latest_whole_iterations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(calibration, "FLOOR_MAX_MICROBATCHES", 30)
    data = _microbatches(random.Random(25), 200)  # 4 a iteration, iterations 0-49
    floor = noise_floor(_start(), data)
    latest = [mb for mb in data if mb.iteration >= 43]  # 7 whole iterations: 28 microbatches, at most 30
    assert floor is not None and floor.microbatches == 28 and floor.iterations == 7
    assert floor == noise_floor(_start(), latest, warmup_iterations=0)

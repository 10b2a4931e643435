"""``LoaderOptions``: the planned loader's settings as one frozen value, the old keywords still mapped onto it
(with a warning naming the new form), and the request a chunk asks for built from it alone."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

from examples.train_tiny import TINY_PROFILE, make_dataset
from skrull.solver.errors import RequestError
from skrull.worker.dataloader import PlannedBatches
from skrull.worker.loader_options import OPTION_NAMES, LoaderOptions
from skrull.worker.loader_requests import chunk_lengths, defer_field, request_document
from skrull.worker.plan_sources import LocalPlans

DATASET = make_dataset(24, max_tokens=96, seed=2)
LENGTHS = [len(row) for row in DATASET]


def options(**changes: object) -> LoaderOptions:
    base = LoaderOptions(global_batch_size=8, profile=TINY_PROFILE, rank=0, dp=1, cp=2, time_budget_s=0.5)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_the_options_are_frozen_and_keyword_only() -> None:
    made = options()
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.seed = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        LoaderOptions(8, TINY_PROFILE)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("batches_per_plan", 0),
        ("prefetch", -1),
        ("plan_ahead", True),
        ("vocab_size", 0),
        ("drop_last", 1),
        ("defer_max_sequences", -2),
        ("defer_max_wait", 3),
        ("label_convention", "shifted"),
        ("global_batch_size", 0),
        ("global_batch_size", "16"),
        ("bucket_tokens", -1),
        ("cp", 0),
        ("rank", -1),
        ("num_iterations", 2.5),
        ("time_budget_s", float("nan")),
        ("profile", ""),
    ],
)
def test_a_bad_option_is_refused_when_the_options_are_made_naming_it(field: str, value: object) -> None:
    with pytest.raises(RequestError) as caught:
        options(**{field: value})
    assert caught.value.field == field


def test_the_old_keywords_still_make_the_same_loader_and_warn_naming_the_new_form() -> None:
    new = PlannedBatches(DATASET, LENGTHS, options(), plans=LocalPlans())
    with pytest.warns(DeprecationWarning, match=r"LoaderOptions\(global_batch_size=\.\.\., profile=\.\.\.") as seen:
        old = PlannedBatches(
            DATASET,
            LENGTHS,
            plans=LocalPlans(),
            global_batch_size=8,
            profile=TINY_PROFILE,
            rank=0,
            dp=1,
            cp=2,
            time_budget_s=0.5,
        )
    try:
        assert seen[0].filename == __file__  # the warning points at the caller's line
        assert old.options == new.options
        assert old.request_document(0) == new.request_document(0)
        assert [ready.sample_indices for ready in old] == [ready.sample_indices for ready in new]
    finally:
        old.close()
        new.close()


def test_the_new_form_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        PlannedBatches(DATASET, LENGTHS, options(), plans=LocalPlans()).close()


def test_options_and_keywords_together_or_neither_are_refused_naming_options() -> None:
    with pytest.raises(RequestError, match="not both") as both:
        PlannedBatches(DATASET, LENGTHS, options(), plans=LocalPlans(), seed=4)
    assert both.value.field == "options"
    with pytest.raises(RequestError, match="LoaderOptions") as neither:
        PlannedBatches(DATASET, LENGTHS, plans=LocalPlans())
    assert neither.value.field == "options"
    with pytest.raises(TypeError, match="'sed'"):
        PlannedBatches(DATASET, LENGTHS, plans=LocalPlans(), sed=4)


def test_every_old_keyword_is_an_option() -> None:
    # the keywords PlannedBatches took before LoaderOptions (besides the live objects it still takes)
    old = {
        "global_batch_size", "profile", "rank", "dp", "cp", "seed", "epoch", "shuffle", "solver",
        "batches_per_plan", "prefetch", "num_iterations", "bucket_tokens", "time_budget_s", "timeout_s",
        "equal_microbatches", "deterministic", "defer_max_sequences", "defer_max_wait", "cp_modes",
        "label_convention", "drop_last", "vocab_size", "plan_ahead", "planning_share", "calibrate", "dataset_name",
    }  # fmt: skip
    assert set(OPTION_NAMES) == old


def test_the_evaluation_loader_derives_its_options_from_the_training_ones() -> None:
    train = PlannedBatches(
        DATASET, LENGTHS, options(seed=5, epoch=2, batches_per_plan=3, num_iterations=1), plans=LocalPlans()
    )
    try:
        evaluation = train.for_evaluation(DATASET[:10], LENGTHS[:10])
        assert evaluation.options == dataclasses.replace(
            train.options,
            epoch=0,
            shuffle=False,
            batches_per_plan=1,
            num_iterations=None,
            equal_microbatches=True,
            dataset_name="eval_dataset",
        )
        assert evaluation.plans is train.plans
        assert [i for ready in evaluation for i in ready.sample_indices] == list(range(10))
    finally:
        train.close()


@given(
    lengths=st.lists(st.integers(1, 50), min_size=1, max_size=12),
    carried=st.integers(0, 3),
    max_sequences=st.integers(0, 3),
    last=st.booleans(),
)
def test_a_request_holds_every_row_of_its_chunk_once_carried_rows_first(
    lengths: list[int], carried: int, max_sequences: int, last: bool
) -> None:
    carried = min(carried, len(lengths) - 1)
    batches = [list(range(carried, len(lengths)))]
    made = options(defer_max_sequences=max_sequences, time_budget_s=None)
    asked: list[tuple[list[int], bool]] = []
    doc = request_document(
        made,
        batches=chunk_lengths(lengths, batches, list(range(carried))),
        dp=1,
        cp=2,
        cp_modes=("allgather",),
        profile=TINY_PROFILE,
        last=last,
        carried=carried,
        budget_s=lambda sizes, deferring: asked.append((sizes, deferring)) or 0.25,
    )
    assert doc["batches"] == [lengths]
    assert doc["time_budget_s"] == 0.25
    assert asked == [([len(lengths)], bool(max_sequences) and not last)]
    assert doc.get("defer") == defer_field(made, last=last, carried=carried)
    if max_sequences:
        assert doc["defer"]["max_sequences"] == (0 if last else max_sequences)
        assert doc["defer"].get("carried", 0) == carried

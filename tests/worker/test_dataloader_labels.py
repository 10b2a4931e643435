"""The loader reads labels in the convention it is told: Hugging Face's (the model shifts) is shifted once
into next-token targets, giving exactly the microbatches of rows that carry those targets already; an
unknown convention, labels in the other convention and labels of another length are refused, naming the field."""

from __future__ import annotations

import random

import pytest

from skrull.solver.errors import RequestError
from skrull.worker.dataloader import PlannedBatches
from skrull.worker.loader_options import LoaderOptions

PROFILE = "h100-80g/qwen2.5-0.5b"


def rows_both_ways(n: int, seed: int) -> tuple[list[dict[str, list[int]]], list[dict[str, list[int]]]]:
    rng = random.Random(seed)
    hf, targets = [], []
    for _ in range(n):
        ids = [rng.randrange(128) for _ in range(rng.choice([2, 5, 17, 40, 90]))]
        prompt = len(ids) // 3
        labels = [-100] * prompt + ids[prompt:]  # Hugging Face: aligned with input_ids, a masked prompt
        hf.append({"input_ids": ids, "labels": labels})
        targets.append({"input_ids": ids, "labels": [*labels[1:], -100]})
    return hf, targets


def microbatches(rows: list[dict[str, list[int]]], convention: str) -> list[tuple[list[int], list[int]]]:
    loader = PlannedBatches(
        rows,
        [len(r["input_ids"]) for r in rows],
        LoaderOptions(
            rank=1, dp=1, cp=2, global_batch_size=8, profile=PROFILE, bucket_tokens=64, shuffle=False, prefetch=0,
            label_convention=convention
        ),
    )  # fmt: skip
    out = [(mb.input_ids.tolist(), mb.labels.tolist()) for ready in loader for mb in ready.microbatches]
    loader.close()
    return out


def test_hugging_face_labels_are_shifted_once_into_the_loaders_targets() -> None:
    hf, targets = rows_both_ways(24, seed=4)
    got = microbatches(hf, "hf")
    assert got == microbatches(targets, "next_token")
    assert any(-100 in labels for _, labels in got) and any(ids for ids, _ in got)


def test_labels_in_the_other_convention_are_refused_naming_label_convention() -> None:
    """Hugging Face's labels read as next-token targets would train each position on itself (found: relative
    error 9.3, silently); next-token targets read as Hugging Face's would be shifted twice. The rows tell
    which they are, so both are refused, naming the setting and the row."""
    hf, targets = rows_both_ways(24, seed=4)
    with pytest.raises(RequestError, match=r"label_convention: 'next_token': dataset\[\d+\]\.labels equal its "
                       r"input_ids.*label_convention='hf'"):  # fmt: skip
        microbatches(hf, "next_token")
    with pytest.raises(RequestError, match=r"label_convention: 'hf': .*already shifted.*label_convention='next_token'"):
        microbatches(targets, "hf")
    # a row of one repeated token reads both ways: nothing to tell, it is let through
    same = [{"input_ids": [7] * 6, "labels": [-100, 7, 7, 7, 7, 7]}]
    assert microbatches(same * 8, "next_token")


def test_labels_of_another_length_and_rows_of_an_eval_set_are_named_so() -> None:
    rows = [{"input_ids": [1, 2, 3], "labels": [2, 3]}] * 8
    with pytest.raises(RequestError, match=r"dataset\[\d\]\.labels: 2: labels for 3 input_ids: one per token"):
        microbatches(rows, "next_token")
    train, _ = rows_both_ways(8, seed=2)
    loader = PlannedBatches(
        train,
        [len(r["input_ids"]) for r in train],
        LoaderOptions(
            rank=0, dp=1, cp=1, global_batch_size=8, profile=PROFILE, bucket_tokens=128, prefetch=0,
            label_convention="hf"
        ),
    )  # fmt: skip
    with pytest.raises(RequestError, match=r"eval_dataset\[1\]: 500: tokens: no layout holds it"):
        loader.for_evaluation([[1] * 5, [1] * 500], [5, 500])
    loader.close()


def test_an_unknown_label_convention_is_refused_naming_the_field() -> None:
    hf, _ = rows_both_ways(4, seed=1)
    with pytest.raises(RequestError) as caught:
        PlannedBatches(
            hf,
            [len(r["input_ids"]) for r in hf],
            LoaderOptions(rank=0, dp=1, cp=1, global_batch_size=4, profile=PROFILE, label_convention="shifted"),
        )  # fmt: skip
    assert caught.value.field == "label_convention"

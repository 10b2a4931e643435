"""The loader's inputs and epochs, as a torch ``DataLoader`` user expects them: integer token ids only
(refused naming the dataset index, never truncated), an empty dataset and a row no layout can hold refused
at construction, the partial last batch kept unless ``drop_last``, and a second pass = the next epoch."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from skrull.solver.errors import RequestError
from skrull.worker.dataloader import PlannedBatches
from skrull.worker.loader_options import LoaderOptions

PROFILE = "h100-80g/qwen2.5-0.5b"


def make(rows: Any, **kw: Any) -> PlannedBatches:
    options: dict[str, Any] = {
        "rank": 0, "dp": 1, "cp": 1, "global_batch_size": 4, "profile": PROFILE, "solver": "skrull",
        "bucket_tokens": 64, "prefetch": 0, **kw,
    }  # fmt: skip
    lengths = options.pop("lengths", None) or [len(r["input_ids"] if isinstance(r, dict) else r) for r in rows]
    return PlannedBatches(rows, lengths, LoaderOptions(**options))


def rows(n: int) -> list[list[int]]:
    return [[(i + t) % 50 for t in range(3 + i % 7)] for i in range(n)]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ([1, 3.7, 2], r"dataset\[1\]\.input_ids: 3\.7: token ids and labels must be integers"),
        ([1, 3.0, 2], r"dataset\[1\]\.input_ids: 3\.0: token ids and labels must be integers"),
        ([1, True, 2], r"dataset\[1\]\.input_ids: True: token ids and labels must be integers"),
        (torch.tensor([1.0, 2.0, 3.0]), r"dataset\[1\]\.input_ids: 'torch\.float32': token ids and labels must be"),
        (torch.tensor([True, False, True]), r"dataset\[1\]\.input_ids: 'torch\.bool': token ids"),
        ([1, -4, 2], r"dataset\[1\]\.input_ids: -4: token ids must be >= 0"),
        ([1, 77, 2], r"dataset\[1\]\.input_ids: 77: is out of the vocabulary \(vocab_size=64\)"),
        ({"input_ids": [1, 2, 3], "labels": [2, -7, -100]}, r"dataset\[1\]\.labels: -7: labels are token ids or -100"),
    ],
)
def test_token_ids_that_are_not_integers_of_the_vocabulary_are_refused(row: Any, message: str) -> None:
    data: list[Any] = [[5, 6, 7], row, [1, 2, 3], [4, 5, 6]]
    loader = make(data, lengths=[3, 3, 3, 3], vocab_size=64)
    with pytest.raises(RequestError, match=message):
        next(iter(loader))


def test_numpy_integers_are_token_ids() -> None:
    np = pytest.importorskip("numpy")
    data = [list(np.arange(3, dtype=np.int64) + i) for i in range(4)]
    ready = next(iter(make(data)))
    assert sorted(ready.sample_indices) == [0, 1, 2, 3]


def test_an_empty_dataset_is_refused() -> None:
    with pytest.raises(RequestError, match="dataset: 0: is empty"):
        make([], lengths=[])


def test_a_row_no_layout_can_hold_is_refused_at_construction_naming_its_index() -> None:
    data = rows(7)
    data[5] = list(range(130))  # cp 2 x bucket 64 = 128 tokens at most
    message = r"dataset\[5\]: 130: tokens: no layout holds it \(cp=2 x bucket_tokens=64"
    with pytest.raises(RequestError, match=message) as e:
        make(data, cp=2)
    assert "bucket_tokens >= 65 at cp=2" in str(e.value) and "cp >= 3" in str(e.value)


def test_the_partial_last_batch_is_kept_unless_drop_last() -> None:
    data = rows(10)  # 4 + 4 + 2
    kept = [r.sample_indices for r in make(data)]
    assert [len(b) for b in kept] == [4, 4, 2]
    assert sorted(i for b in kept for i in b) == list(range(10))
    dropped = [r.sample_indices for r in make(data, drop_last=True)]
    assert [len(b) for b in dropped] == [4, 4] and dropped == kept[:2]


def test_a_second_pass_is_the_next_epoch_reshuffled_by_seed_and_epoch() -> None:
    data = rows(8)
    loader = make(data, seed=7)
    first = [r.sample_indices for r in loader]
    second = [r.sample_indices for r in loader]
    assert loader.epoch == 1 and len(second) == 2
    assert sorted(i for b in second for i in b) == list(range(8)) and second != first
    again = make(data, seed=7)
    again.set_epoch(1)
    assert [r.sample_indices for r in again] == second  # deterministic: the epoch's order from seed and epoch
    again.set_epoch(0)
    assert [r.sample_indices for r in again] == first


def test_a_saved_state_resumes_in_its_epoch() -> None:
    data = rows(12)
    loader = make(data, seed=2)
    list(loader)
    it = iter(loader)  # epoch 1
    want = [r.sample_indices for r in it]
    loader.set_epoch(1)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert state["epoch"] == 1 and state["next_iteration"] == 1
    fresh = make(data, seed=2)
    fresh.load_state_dict(state)
    assert [r.sample_indices for r in fresh] == want[1:]

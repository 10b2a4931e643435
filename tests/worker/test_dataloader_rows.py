"""Bad rows stop every rank alike, before the step that would use them, naming ``dataset[i]``; a columnar
dataset (``datasets.Dataset``, ``pyarrow.Table``) has its ids checked at construction in one vectorised pass;
the loader inside a ``torch.utils.data.DataLoader`` is refused, pointing at iterating it directly."""

from __future__ import annotations

import random
import traceback

import pyarrow as pa
import pytest
import torch
from datasets import Dataset

from skrull.solver.errors import RequestError
from skrull.worker.dataloader import PlannedBatches
from skrull.worker.loader_options import LoaderOptions

PROFILE = "h100-80g/qwen2.5-0.5b"


def rows(n: int = 24, seed: int = 5) -> list[dict[str, list[int]]]:
    rng = random.Random(seed)
    return [{"input_ids": [rng.randrange(100) for _ in range(rng.choice([3, 9, 30, 60]))]} for _ in range(n)]


def loader(dataset: object, lengths: list[int], *, rank: int = 0, **kw: object) -> PlannedBatches:
    options: dict = {"global_batch_size": 8, "profile": PROFILE, "bucket_tokens": 64, "prefetch": 0, **kw}
    return PlannedBatches(dataset, lengths, LoaderOptions(rank=rank, dp=2, cp=2, shuffle=False, **options))


def test_a_bad_row_stops_every_rank_at_the_same_iteration_with_the_same_line() -> None:
    """Found: the rank packing the row stopped alone; the others died in their next collective with gloo's
    "Connection closed by peer". Every rank now reads every row of the global batch: all four ranks train
    iteration 0, and all stop at iteration 1 (the row's) with one line naming it."""
    data = rows()
    data[11]["input_ids"][1] = 500  # global batch 1 (rows 8..15, in order: shuffle off)
    lengths = [len(r["input_ids"]) for r in data]
    said = []
    for rank in range(4):
        planned = loader(data, lengths, rank=rank, vocab_size=128)
        it = iter(planned)
        assert next(it).iteration == 0
        with pytest.raises(RequestError) as caught:
            next(it)
        said.append(str(caught.value))
        planned.close()
    assert said == [said[0]] * 4, said
    assert said[0].startswith("dataset[11].input_ids: 500: is out of the vocabulary (vocab_size=128)")


@pytest.mark.parametrize("kind", ["datasets", "arrow"])
def test_a_columnar_dataset_is_checked_at_construction_in_one_pass(kind: str) -> None:
    data = rows()
    lengths = [len(r["input_ids"]) for r in data]
    data[17]["input_ids"][-1] = 130
    table = pa.Table.from_pylist(data)
    dataset = Dataset.from_list(data) if kind == "datasets" else table
    with pytest.raises(RequestError, match=r"^dataset\[17\]\.input_ids: 130: is out of the vocabulary"):
        loader(dataset, lengths, vocab_size=128)
    planned = loader(dataset, lengths)  # no vocabulary given: nothing out of it yet
    with pytest.raises(RequestError, match=r"^dataset\[17\]\.input_ids: 130"):
        planned.vocab_size = 128  # what SkrullTrainer sets from the model, checked when set
    planned.close()
    data[17]["input_ids"][-1] = 5
    data[4]["input_ids"][0] = -3
    negative = Dataset.from_list(data) if kind == "datasets" else pa.Table.from_pylist(data)
    with pytest.raises(RequestError, match=r"^dataset\[4\]\.input_ids: -3: token ids must be >= 0"):
        loader(negative, lengths)
    data[4]["input_ids"][0] = 4
    good = Dataset.from_list(data) if kind == "datasets" else pa.Table.from_pylist(data)
    planned = loader(good, lengths, vocab_size=128)  # checked at construction: each rank reads its own rows
    assert sum(mb.num_tokens for ready in planned for mb in ready.microbatches) > 0
    planned.close()
    short = [*lengths[:-1], lengths[-1] + 1]
    with pytest.raises(RequestError, match=rf"^dataset\[23\]\.input_ids: {lengths[-1]}: tokens: a length other"):
        loader(negative if kind == "arrow" else Dataset.from_list(data), short)


def test_a_columnar_datasets_labels_are_checked_too() -> None:
    data = [{"input_ids": r["input_ids"], "labels": [-100, *r["input_ids"][1:]]} for r in rows()]
    data[6]["labels"][0] = -7
    lengths = [len(r["input_ids"]) for r in data]
    with pytest.raises(RequestError, match=r"^dataset\[6\]\.labels: -7: labels are token ids or -100"):
        loader(Dataset.from_list(data), lengths, label_convention="hf")
    data[6]["labels"][0] = -100
    planned = loader(Dataset.from_list(data), lengths, label_convention="hf", vocab_size=128)
    assert sum(len(ready.microbatches) for ready in planned) > 0  # the good rows train
    planned.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_inside_a_torch_dataloader_is_refused_pointing_at_iterating_it(workers: int) -> None:
    """Found: DataLoader(planned, batch_size=None, num_workers=2) failed with "'PlannedBatches' object is not
    subscriptable", pointing nowhere; it is the loader itself (threads pack ahead, plans made once per node)."""
    data = rows()
    planned = loader(data, [len(r["input_ids"]) for r in data])
    batches = iter(torch.utils.data.DataLoader(planned, batch_size=None, num_workers=workers))
    with pytest.raises(TypeError, match=r"PlannedBatches is the data loader itself.*for ready in planned") as caught:
        next(batches)
    # The refusal's traceback holds the iterator in a cycle: left to a later garbage collection, its worker
    # processes' shutdown took 10 s of another test. Freed here, they stop at once.
    traceback.clear_frames(caught.tb)
    del batches
    planned.close()

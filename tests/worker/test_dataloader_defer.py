"""PlannedBatches with ``defer_max_sequences``: what a plan leaves pending is carried into the next request,
every dataset index is yielded exactly once over the epoch (resumed from ``state_dict`` or not), none waits
more than one iteration, and every rank's tokens are the dataset's. Plans are made in process
(``LocalPlans``), deterministic, on a small budget."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from examples.train_tiny import TINY_PROFILE
from skrull.solver.errors import RequestError
from skrull.worker.dataloader import PlannedBatches, ReadyIteration
from skrull.worker.plan_sources import LocalPlans

BUCKET = TINY_PROFILE["memory"]["bucket_tokens"]


def dataset_of(lengths: list[int]) -> list[list[int]]:
    """Token k of sample i is ``i * 1000 + k``: every delivered token names its sample and position."""
    return [[i * 1000 + k for k in range(n)] for i, n in enumerate(lengths)]


def make_loader(lengths: list[int], *, plans: LocalPlans, rank: int = 0, **kw: Any) -> PlannedBatches:
    options: dict[str, Any] = {"global_batch_size": 6, "seed": 2, "dp": 2, "cp": 1, "time_budget_s": 0.05}
    options.update(kw)
    return PlannedBatches(dataset_of(lengths), lengths, profile=TINY_PROFILE, plans=plans, rank=rank, **options)


def run(loader: PlannedBatches, stop: int | None = None) -> Iterator[ReadyIteration]:
    for k, ready in enumerate(loader):
        yield ready
        if stop is not None and k + 1 == stop:
            return


def check_epoch(loader: PlannedBatches, yielded: list[tuple[int, tuple[int, ...]]]) -> None:
    """Every index of the epoch's batches exactly once, in its own batch's iteration or the next."""
    batch_of = {i: b for b, batch in enumerate(loader.batches) for i in batch}
    indices = [i for _, samples in yielded for i in samples]
    assert sorted(indices) == sorted(batch_of)
    assert all(batch_of[i] in (it, it - 1) for it, samples in yielded for i in samples)
    assert [it for it, _ in yielded] == list(range(len(loader.batches)))


@settings(max_examples=8, deadline=None)
@given(
    lengths=st.lists(st.integers(1, BUCKET), min_size=12, max_size=40),
    k=st.integers(0, 3),
    per_plan=st.integers(1, 2),
    stop=st.integers(0, 6),
)
def test_every_index_once_over_the_epoch_resumed_or_not(lengths: list[int], k: int, per_plan: int, stop: int) -> None:
    plans = LocalPlans()
    try:
        straight = make_loader(lengths, plans=plans, defer_max_sequences=k, batches_per_plan=per_plan)
        whole = [(r.iteration, r.sample_indices) for r in run(straight)]
        check_epoch(straight, whole)
        first = make_loader(lengths, plans=plans, defer_max_sequences=k, batches_per_plan=per_plan)
        head = [(r.iteration, r.sample_indices) for r in run(first, stop)]
        state = first.state_dict()
        resumed = make_loader(lengths, plans=LocalPlans(), defer_max_sequences=k, batches_per_plan=per_plan)
        resumed.load_state_dict(state)  # a fresh process: its plans know nothing of the first run's
        tail = [(r.iteration, r.sample_indices) for r in run(resumed)]
        assert head + tail == whole  # resuming is exact: the same iterations, the same sequences in each
        for loader in (straight, first, resumed):
            loader.close()
    finally:
        plans.close()


def test_deferred_sequences_reach_the_next_iteration_token_for_token_on_every_rank() -> None:
    lengths = [((i * 37) % 60) + 4 for i in range(48)]
    plans = LocalPlans()
    tokens: dict[tuple[int, int], int] = {}
    runs: dict[int, list[tuple[int, tuple[int, ...]]]] = {}
    for rank in range(2):
        loader = make_loader(lengths, plans=plans, rank=rank, defer_max_sequences=2, global_batch_size=8)
        runs[rank] = []
        for ready in loader:
            runs[rank].append((ready.iteration, ready.sample_indices))
            for mb in ready.microbatches:
                assert mb.loss_normalizer == sum(lengths[i] for i in ready.sample_indices)
                for token in mb.input_ids.tolist():
                    sample, pos = divmod(token, 1000)
                    assert sample in ready.sample_indices and (sample, pos) not in tokens
                    tokens[(sample, pos)] = rank
        check_epoch(loader, runs[rank])
        moved = [samples for it, samples in runs[rank] if sorted(samples) != sorted(loader.batches[it])]
        assert moved, "these lengths leave a GPU a straggler: some sequence waits"
        loader.close()
    plans.close()
    assert runs[0] == runs[1]  # every rank sees the same iterations
    assert set(tokens) == {(i, p) for i, n in enumerate(lengths) for p in range(n)}


def test_defer_needs_auto_and_a_count() -> None:
    plans = LocalPlans()
    with pytest.raises(RequestError) as caught:
        make_loader([5] * 12, plans=plans, solver="skrull", defer_max_sequences=2)
    assert caught.value.field == "defer_max_sequences"
    with pytest.raises(RequestError) as bad:
        make_loader([5] * 12, plans=plans, defer_max_sequences=-1)
    assert (bad.value.field, bad.value.value) == ("defer_max_sequences", -1)
    plans.close()


def test_a_saved_state_names_what_it_carries_and_bad_carried_indices_are_refused() -> None:
    plans = LocalPlans()
    loader = make_loader([5] * 24, plans=plans, defer_max_sequences=2)
    state = loader.state_dict()
    assert (state["defer_max_sequences"], state["carried"], state["next_iteration"]) == (2, [], 0)
    later = loader.batches[2][0]
    with pytest.raises(RequestError) as caught:  # an index of a batch not yet reached cannot be carried
        loader.load_state_dict({**state, "next_iteration": 1, "carried": [later]})
    assert caught.value.field == "state_dict.carried"
    with pytest.raises(RequestError) as other:
        loader.load_state_dict({**state, "defer_max_sequences": 3})
    assert other.value.field == "state_dict.defer_max_sequences"
    plain = make_loader([5] * 24, plans=plans)
    old = {key: value for key, value in plain.state_dict().items() if key not in ("defer_max_sequences", "carried")}
    plain.load_state_dict({**old, "next_iteration": 2})  # saved before the loader deferred: it resumes
    assert plain.next_iteration == 2
    for each in (loader, plain):
        each.close()
    plans.close()

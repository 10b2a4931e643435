"""PlannedBatches with ``defer_max_sequences``: what a plan leaves pending is carried into the next request,
every dataset index is yielded exactly once over the epoch (resumed from ``state_dict`` or not), none waits
more than ``defer_max_wait`` iterations (one by default), and every rank's tokens are the dataset's. Plans
are made in process (``LocalPlans``), deterministic, on a small budget."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from examples.train_tiny import TINY_PROFILE
from skrull.solver.errors import RequestError
from skrull.worker.dataloader import PlannedBatches, ReadyIteration
from skrull.worker.loader_options import LoaderOptions
from skrull.worker.plan_sources import LocalPlans

BUCKET = TINY_PROFILE["memory"]["bucket_tokens"]


def dataset_of(lengths: list[int]) -> list[list[int]]:
    """Token k of sample i is ``i * 1000 + k``: every delivered token names its sample and position."""
    return [[i * 1000 + k for k in range(n)] for i, n in enumerate(lengths)]


def make_loader(lengths: list[int], *, plans: LocalPlans, rank: int = 0, **kw: Any) -> PlannedBatches:
    options: dict[str, Any] = {"global_batch_size": 6, "seed": 2, "dp": 2, "cp": 1, "time_budget_s": 0.05}
    options.update(kw)
    return PlannedBatches(
        dataset_of(lengths), lengths, LoaderOptions(profile=TINY_PROFILE, rank=rank, **options), plans=plans
    )


def run(loader: PlannedBatches, stop: int | None = None) -> Iterator[ReadyIteration]:
    for k, ready in enumerate(loader):
        yield ready
        if stop is not None and k + 1 == stop:
            return


def check_epoch(loader: PlannedBatches, yielded: list[tuple[int, tuple[int, ...]]], *, max_wait: int = 1) -> None:
    """Every index of the epoch's batches exactly once, in its own batch's iteration or at most ``max_wait``
    later, and no batch has more than ``defer_max_sequences`` of its sequences run late."""
    batch_of = {i: b for b, batch in enumerate(loader.batches) for i in batch}
    indices = [i for _, samples in yielded for i in samples]
    assert sorted(indices) == sorted(batch_of)
    assert all(0 <= it - batch_of[i] <= max_wait for it, samples in yielded for i in samples)
    late = [batch_of[i] for it, samples in yielded for i in samples if it > batch_of[i]]
    assert all(late.count(b) <= loader.defer_max_sequences for b in set(late))
    assert [it for it, _ in yielded] == list(range(len(loader.batches)))


@settings(max_examples=8, deadline=None)
@given(
    lengths=st.lists(st.integers(1, BUCKET), min_size=12, max_size=40),
    k=st.integers(0, 3),
    per_plan=st.integers(1, 3),
    wait=st.integers(1, 3),
    stop=st.integers(0, 6),
)
def test_every_index_once_over_the_epoch_resumed_or_not(
    lengths: list[int], k: int, per_plan: int, wait: int, stop: int
) -> None:
    plans = LocalPlans()
    wait = wait if k else 1  # a wait bounds deferral: the loader refuses one without it
    options = {"defer_max_sequences": k, "defer_max_wait": wait, "batches_per_plan": per_plan}
    try:
        straight = make_loader(lengths, plans=plans, **options)
        whole = [(r.iteration, r.sample_indices) for r in run(straight)]
        check_epoch(straight, whole, max_wait=wait)
        first = make_loader(lengths, plans=plans, **options)
        head = [(r.iteration, r.sample_indices) for r in run(first, stop)]
        state = first.state_dict()
        resumed = make_loader(lengths, plans=LocalPlans(), **options)
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


def test_a_longer_wait_reaches_the_plans_and_sequences_run_up_to_that_many_iterations_late() -> None:
    # Three global batches per request, in dataset order; from batch 0 and batch 1 an outlier (32 and
    # 54 + 40 + 64 tokens of a 64-token bucket beside 1-7 token sequences) leaves a GPU a straggler. With
    # these lengths ``auto`` (deterministic) runs some sequence two iterations after its batch.
    first = [[7, 6, 7, 1, 1, 32], [4, 6, 54, 4, 40, 64], [4, 2, 6, 5, 4, 5]]
    lengths = [n for batch in first for n in batch] + [5, 3, 6, 2, 4, 7] * 3
    plans = LocalPlans()
    options: dict[str, Any] = {"shuffle": False, "batches_per_plan": 3, "defer_max_sequences": 2}
    loader = make_loader(lengths, plans=plans, defer_max_wait=3, **options)
    assert [[lengths[i] for i in b] for b in loader.batches[:3]] == first
    request = loader.request_document(0)
    assert request["defer"] == {"max_sequences": 2, "max_wait": 3}
    assert loader.request_document(1)["defer"]["max_sequences"] == 0  # the end of the data: nothing waits
    yielded = [(r.iteration, r.sample_indices) for r in run(loader)]
    check_epoch(loader, yielded, max_wait=3)
    batch_of = {i: b for b, batch in enumerate(loader.batches) for i in batch}
    assert max(it - batch_of[i] for it, samples in yielded for i in samples) >= 2
    state = loader.state_dict()
    assert state["defer_max_wait"] == 3
    # the same request with the default wait lets nothing wait twice
    once = make_loader(lengths, plans=plans, **options)
    assert "max_wait" not in once.request_document(0)["defer"]
    check_epoch(once, [(r.iteration, r.sample_indices) for r in run(once)], max_wait=1)
    with pytest.raises(RequestError) as other:  # a state saved with another wait is not resumed here
        once.load_state_dict(state)
    assert other.value.field == "state_dict.defer_max_wait"
    for each in (loader, once):
        each.close()
    plans.close()


def test_defer_needs_auto_and_a_count() -> None:
    plans = LocalPlans()
    with pytest.raises(RequestError) as caught:
        make_loader([5] * 12, plans=plans, solver="skrull", defer_max_sequences=2)
    assert caught.value.field == "defer_max_sequences"
    with pytest.raises(RequestError) as bad:
        make_loader([5] * 12, plans=plans, defer_max_sequences=-1)
    assert (bad.value.field, bad.value.value) == ("defer_max_sequences", -1)
    for wait in (0, True, 1.5, 2**21):
        with pytest.raises(RequestError) as waits:
            make_loader([5] * 12, plans=plans, defer_max_sequences=2, defer_max_wait=wait)
        assert (waits.value.field, waits.value.value) == ("defer_max_wait", wait)
    with pytest.raises(RequestError) as alone:  # a wait without deferral would be silently ignored
        make_loader([5] * 12, plans=plans, defer_max_wait=2)
    assert alone.value.field == "defer_max_wait" and "defer_max_sequences" in str(alone.value)
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
    earlier = loader.batches[0][0]
    with pytest.raises(RequestError) as waited:  # nor one that would wait two iterations
        loader.load_state_dict({**state, "next_iteration": 2, "carried": [earlier]})
    assert waited.value.field == "state_dict.carried"
    three = list(loader.batches[1][:3])
    with pytest.raises(RequestError) as many:  # nor more of one batch than it may defer
        loader.load_state_dict({**state, "next_iteration": 2, "carried": three})
    assert many.value.field == "state_dict.carried"
    loader.load_state_dict({**state, "next_iteration": 2, "carried": three[:2]})
    assert loader.state_dict()["carried"] == three[:2]
    longer = make_loader([5] * 24, plans=plans, defer_max_sequences=2, defer_max_wait=2, batches_per_plan=2)
    longer.load_state_dict({**longer.state_dict(), "next_iteration": 2, "carried": [loader.batches[0][0], *three[:2]]})
    assert longer.state_dict()["carried"] == [loader.batches[0][0], *three[:2]]  # both batches may carry now
    longer.close()
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

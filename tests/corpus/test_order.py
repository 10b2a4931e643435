"""The loader's order: a seeded permutation cut into global batches, the same everywhere."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from skrull.corpus.order import global_batches, sample_order
from skrull.solver.errors import RequestError


@given(n=st.integers(0, 500), size=st.integers(1, 64), seed=st.integers(0, 2**31), keep=st.booleans())
def test_batches_are_disjoint_full_and_cover_the_order(n: int, size: int, seed: int, keep: bool) -> None:
    batches = global_batches(n, global_batch_size=size, seed=seed, drop_last=not keep)
    flat = [i for b in batches for i in b]
    assert len(flat) == len(set(flat))
    assert flat == sample_order(n, seed=seed)[: len(flat)]
    assert all(len(b) == size for b in batches[:-1])
    if keep:
        assert sorted(flat) == list(range(n))
    else:
        assert len(flat) == (n // size) * size


def test_order_depends_on_seed_and_epoch_only() -> None:
    assert sample_order(100, seed=3) == sample_order(100, seed=3)
    assert sample_order(100, seed=3) != sample_order(100, seed=4)
    assert sample_order(100, seed=3, epoch=1) != sample_order(100, seed=3)
    assert sample_order(10, seed=3, shuffle=False) == list(range(10))


def test_rejects_a_batch_size_below_one() -> None:
    with pytest.raises(RequestError, match="--global-batch-size"):
        global_batches(10, global_batch_size=0, seed=0)

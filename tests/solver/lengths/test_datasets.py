"""Length distributions: seeded, faithful to their tables, truncated to what a plan can hold."""

from __future__ import annotations

import json

import numpy as np
import pytest

from skrull.solver.errors import RequestError
from skrull.solver.lengths.datasets import distribution_names, distributions_dir, load_distribution, synthesize_request
from skrull.solver.profile import load_profile
from skrull.solver.types import Parallel

PROFILE = "h100-80g/qwen2.5-0.5b"


def test_bundles_the_named_distributions() -> None:
    assert {"sharegpt", "azure-conv", "azure-code", "arxiv", "mooncake", "llama3-sft-mix", "chatqa2-long-sft"} <= set(
        distribution_names()
    )
    for name in distribution_names():
        doc = json.loads((distributions_dir() / f"{name}.json").read_text())
        assert doc["source"]


@pytest.mark.parametrize("name", ["sharegpt", "mooncake", "azure-code"])
def test_samples_reproduce_the_table_median(name: str) -> None:
    dist = load_distribution(name)
    table = dict((q, v) for q, v in dist.doc["percentiles"])
    sample = dist.sample(20000, np.random.default_rng(1))
    assert np.median(sample) == pytest.approx(table[50.0], rel=0.05)
    assert sample.min() >= 1


def test_llama3_mix_is_mostly_short_with_a_rare_long_tail() -> None:
    sample = load_distribution("llama3-sft-mix").sample(200_000, np.random.default_rng(0))
    long = sample >= 16384
    assert long.mean() == pytest.approx(0.0011, rel=0.2)
    assert sample[~long].mean() == pytest.approx(1000, rel=0.1)
    assert sample[long].mean() == pytest.approx(37000, rel=0.15)


def test_requests_are_seeded_and_truncated_to_group_capacity() -> None:
    profile = load_profile(PROFILE)
    kwargs = dict(
        dataset="mooncake", parallel=Parallel(dp=2, cp=2), profile=profile, sequences_per_rank=64, num_batches=2
    )
    a = synthesize_request(seed=3, **kwargs)  # type: ignore[arg-type]
    b = synthesize_request(seed=3, **kwargs)  # type: ignore[arg-type]
    assert a == b
    assert len(a.batches) == 2 and all(len(batch) == 128 for batch in a.batches)
    assert max(max(batch) for batch in a.batches) <= 2 * profile.bucket_tokens


def test_unknown_dataset_is_a_clear_error() -> None:
    with pytest.raises(RequestError) as err:
        load_distribution("wikipedia")
    assert err.value.field == "dataset" and "sharegpt" in str(err.value)

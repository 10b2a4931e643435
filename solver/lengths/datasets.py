"""Real-shaped length distributions and request synthesis from them.

``distributions/*.json`` hold either a percentile table computed from a real trace (kind
``percentiles``; built by ``bench/build_distributions.py`` from the public traces named in each file's ``source``) or a
mixture of clipped log-normals for shapes published without data (kind ``mixture``). Sampling a
percentile table is inverse-CDF sampling with linear interpolation between the tabulated percentiles.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from skrull.solver.cost import CostModel
from skrull.solver.errors import RequestError
from skrull.solver.profile import Profile
from skrull.solver.resources import DISTRIBUTIONS_DIR_ENV, bundled_dir, find_file, list_stems
from skrull.solver.types import Parallel, Request


def distributions_dir() -> Path:
    """The bundled distributions folder inside the installed package (``skrull/distributions``)."""
    return bundled_dir("distributions")


def distribution_names() -> tuple[str, ...]:
    """Bundled distributions plus those in ``$SKRULL_DISTRIBUTIONS_DIR``."""
    return list_stems("distributions", DISTRIBUTIONS_DIR_ENV)


@dataclass(frozen=True, slots=True, kw_only=True)
class LengthDistribution:
    name: str
    source: str
    doc: dict[str, Any]

    def sample(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """``count`` token lengths (int64, >= 1)."""
        if self.doc["kind"] == "percentiles":
            table = np.array(self.doc["percentiles"], dtype=np.float64)
            values = np.interp(rng.uniform(0.0, 100.0, size=count), table[:, 0], table[:, 1])
        else:
            comps = self.doc["components"]
            weights = np.array([c["weight"] for c in comps], dtype=np.float64)
            which = rng.choice(len(comps), size=count, p=weights / weights.sum())
            values = np.empty(count, dtype=np.float64)
            for k, comp in enumerate(comps):
                mask = which == k
                values[mask] = _clipped_lognormal(comp, int(mask.sum()), rng)
        return np.maximum(np.rint(values), 1).astype(np.int64)


def _clipped_lognormal(comp: dict[str, Any], count: int, rng: np.random.Generator) -> np.ndarray:
    """Log-normal with the given mean, redrawn (then clipped) outside [min_tokens, max_tokens]."""
    sigma = float(comp["lognormal"]["sigma"])
    mu = math.log(float(comp["lognormal"]["mean_tokens"])) - sigma * sigma / 2
    lo, hi = float(comp["min_tokens"]), float(comp["max_tokens"])
    out = rng.lognormal(mu, sigma, size=count)
    for _ in range(8):
        bad = (out < lo) | (out > hi)
        if not bad.any():
            break
        out[bad] = rng.lognormal(mu, sigma, size=int(bad.sum()))
    return np.clip(out, lo, hi)


def load_distribution(name: str, *, field: str = "dataset") -> LengthDistribution:
    names = distribution_names()
    if name not in names:
        raise RequestError(field, name, f"unknown dataset; bundled: {', '.join(names)}")
    found = find_file("distributions", DISTRIBUTIONS_DIR_ENV, f"{name}.json")
    assert found is not None, name
    doc = json.loads(found.read_text(encoding="utf-8"))
    return LengthDistribution(name=name, source=doc["source"], doc=doc)


def synthesize_request(
    *,
    dataset: str,
    parallel: Parallel,
    profile: Profile,
    sequences_per_rank: int,
    num_batches: int = 1,
    seed: int = 0,
    solver: str = "auto",
    bucket_tokens: int | None = None,
    max_tokens: int | None = None,
) -> Request:
    """A request of ``num_batches`` global batches of ``dp * sequences_per_rank`` sampled lengths.

    Lengths above ``max_tokens`` (default ``cp * bucket_tokens``, the most any plan can hold, less the
    gathered K/V where the profile charges it: ``CostModel.max_sequence_tokens``, all-gather) are
    truncated to it, as an SFT loader's ``max_length`` would.
    """
    if sequences_per_rank < 1:
        raise RequestError("sequences_per_rank", sequences_per_rank, "must be >= 1")
    if num_batches < 1:
        raise RequestError("num_batches", num_batches, "must be >= 1")
    dist = load_distribution(dataset)
    rng = np.random.default_rng(seed)
    bucket = bucket_tokens if bucket_tokens is not None else profile.bucket_tokens
    if max_tokens is None:  # the gathered K/V lowers it where the profile gives kv_bytes_per_token
        limit = CostModel(profile, bucket_tokens=bucket).max_sequence_tokens(parallel.cp)
    else:
        limit = max_tokens
    per_batch = parallel.dp * sequences_per_rank
    batches = tuple(tuple(int(x) for x in np.minimum(dist.sample(per_batch, rng), limit)) for _ in range(num_batches))
    return Request(
        batches=batches,
        parallel=parallel,
        profile=profile,
        solver=solver,
        bucket_tokens_override=bucket_tokens,
        seed=seed,
    )

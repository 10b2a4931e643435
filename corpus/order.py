"""The loader's order: which dataset samples form each global batch, from a seed alone.

Shared by ``skrull lengths`` (which plans the batches) and ``worker.dataloader`` (which trains on them),
so the sequence ids of a plan name the same samples on both sides without shipping index lists:

    order        = permutation of 0..num_samples-1 by numpy's PCG64 seeded with (seed, epoch)
                   (or 0..num_samples-1 unshuffled)
    global batch b = order[b * global_batch_size : (b + 1) * global_batch_size]

The last, incomplete batch is dropped by default (``drop_last``), as Megatron-style loaders do.
Sequence id ``k`` of a request built from batches ``first..`` is the ``k``-th sample over the
concatenation of those batches (docs/formats.md, "Request").
"""

from __future__ import annotations

import numpy as np

from skrull.solver.errors import RequestError


def sample_order(num_samples: int, *, seed: int, epoch: int = 0, shuffle: bool = True) -> list[int]:
    """Dataset indices in the order the loader visits them in ``epoch``."""
    if num_samples < 0:
        raise RequestError("num_samples", num_samples, "must be an integer >= 0")
    if not shuffle:
        return list(range(num_samples))
    rng = np.random.Generator(np.random.PCG64([seed, epoch]))
    return [int(i) for i in rng.permutation(num_samples)]


def global_batches(
    num_samples: int, *, global_batch_size: int, seed: int, epoch: int = 0, shuffle: bool = True, drop_last: bool = True
) -> list[list[int]]:
    """Dataset indices of every global batch of ``epoch``, in training order."""
    if global_batch_size < 1:
        raise RequestError("--global-batch-size", global_batch_size, "must be an integer >= 1")
    order = sample_order(num_samples, seed=seed, epoch=epoch, shuffle=shuffle)
    batches = [order[k : k + global_batch_size] for k in range(0, len(order), global_batch_size)]
    if drop_last and batches and len(batches[-1]) < global_batch_size:
        batches.pop()
    return batches

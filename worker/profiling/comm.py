"""Timing the context-parallel collective between local GPUs (``skrull profile`` with more than one).

One process per GPU (NCCL; gloo on CPU to exercise the code), all-gathers of growing size; rank 0 writes
the median milliseconds per size. The all-gather is the forward collective of all-gather CP (its
backward reduce-scatter moves the same bytes), so ``ms`` against gathered bytes fits ``ms_per_mib``.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from skrull.worker.collectives import all_gather_slots
from skrull.worker.launch import device_for, launch
from skrull.worker.profiling.fit import CommSample


def _time_all_gathers(
    rank: int, world_size: int, backend: str, sizes: Sequence[int], repeats: int, out_path: str
) -> None:
    device = device_for(backend, rank)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    group = dist.group.WORLD
    assert group is not None
    rows = []
    for gathered_bytes in sizes:
        per_member = max(1, gathered_bytes // world_size // dtype.itemsize)
        send = torch.ones(per_member, dtype=dtype, device=device)
        times = []
        for k in range(repeats + 1):
            dist.barrier()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            all_gather_slots(send, group=group, async_op=False)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if k:  # the first one warms the communicator up
                times.append((time.perf_counter() - start) * 1e3)
        rows.append({"num_bytes": per_member * world_size * dtype.itemsize, "ms": statistics.median(times)})
    if rank == 0:
        Path(out_path).write_text(json.dumps(rows), encoding="utf-8")


def measure_comm(*, num_gpus: int, backend: str, sizes: Sequence[int], repeats: int = 5) -> list[CommSample]:
    """Median all-gather milliseconds over ``num_gpus`` processes for each gathered size in bytes."""
    with tempfile.TemporaryDirectory(prefix="skrull-comm-") as tmp:
        out = Path(tmp) / "comm.json"
        launch(_time_all_gathers, world_size=num_gpus, backend=backend, args=(tuple(sizes), repeats, str(out)))
        rows = json.loads(out.read_text(encoding="utf-8"))
    return [CommSample(num_bytes=float(r["num_bytes"]), ms=float(r["ms"]), group_size=num_gpus) for r in rows]

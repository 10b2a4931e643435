"""Timing the context-parallel collectives between local GPUs (``skrull profile`` with more than one).

One process per GPU (NCCL; gloo on CPU to exercise the code), collectives of growing size; rank 0 writes
the median milliseconds per size.

* All-gather: the forward collective of all-gather CP (its backward reduce-scatter moves the same bytes),
  so ``ms`` against gathered bytes fits ``comm.ms_per_mib``.
* All-to-all (``all_to_all_single``, what a Ulysses exchange runs): ``ms`` against the bytes each member
  sends, its own ``T/N`` tokens' activations, fits ``comm_a2a.ms_per_mib`` (``T_a2a`` charges
  ``(T/N) * bytes_per_token``).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from skrull.worker.collectives import all_gather_slots, all_to_all_slots
from skrull.worker.launch import device_for, launch
from skrull.worker.profiling.fit import ALL_GATHER, ALL_TO_ALL, CommSample


def collective_ms(send: torch.Tensor, *, gather: bool, group: Any, device: torch.device, repeats: int) -> float:
    """Median wall ms of one all-gather (``gather``) or all-to-all of ``send`` over ``group``, each timed
    between a barrier and the device's synchronisation, after one untimed call that warms the communicator."""
    times = []
    for k in range(repeats + 1):
        dist.barrier(group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        if gather:
            all_gather_slots(send, group=group, async_op=False)
        else:
            all_to_all_slots(send, group=group, async_op=False)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if k:
            times.append((time.perf_counter() - start) * 1e3)
    return float(statistics.median(times))


def _time_all_gathers(
    rank: int, world_size: int, backend: str, sizes: Sequence[int], repeats: int, out_path: str
) -> None:
    device = device_for(backend, rank)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    group = dist.group.WORLD
    assert group is not None
    rows = []
    for collective in (ALL_GATHER, ALL_TO_ALL):
        for size in sizes:
            if collective == ALL_GATHER:  # ``size`` gathered bytes: each member brings 1/N of them
                send = torch.ones(max(1, size // world_size // dtype.itemsize), dtype=dtype, device=device)
                counted = send.numel() * world_size * dtype.itemsize
            else:  # ``size`` bytes sent by each member, one slot of it per member
                per_slot = max(1, size // world_size // dtype.itemsize)
                send = torch.ones(per_slot * world_size, dtype=dtype, device=device)
                counted = send.numel() * dtype.itemsize
            ms = collective_ms(send, gather=collective == ALL_GATHER, group=group, device=device, repeats=repeats)
            rows.append({"collective": collective, "num_bytes": counted, "ms": ms})
    if rank == 0:
        Path(out_path).write_text(json.dumps(rows), encoding="utf-8")


def measure_comm(*, num_gpus: int, backend: str, sizes: Sequence[int], repeats: int = 5) -> list[CommSample]:
    """Median milliseconds over ``num_gpus`` processes of an all-gather of each size in gathered bytes, then
    of an all-to-all of each size in bytes every member sends (``CommSample.collective``)."""
    with tempfile.TemporaryDirectory(prefix="skrull-comm-") as tmp:
        out = Path(tmp) / "comm.json"
        launch(_time_all_gathers, world_size=num_gpus, backend=backend, args=(tuple(sizes), repeats, str(out)))
        rows = json.loads(out.read_text(encoding="utf-8"))
    return [
        CommSample(num_bytes=float(r["num_bytes"]), ms=float(r["ms"]), group_size=num_gpus, collective=r["collective"])
        for r in rows
    ]

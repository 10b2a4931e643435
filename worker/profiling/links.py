"""Measuring the cluster's links: all-gather and all-to-all bus bandwidth per group size (``skrull profile --links``).

The cost model prices a context-parallel group with the link its ranks use (docs/formats.md, "Cluster
topology and gathered K/V"): ``intra_node`` when all of them are on one node, else ``inter_node``, each
with ``allgather_ms_per_mib`` and ``alltoall_ms_per_mib``, 1 / bus bandwidth in ms per MiB. Bus bandwidth
as nccl-tests defines it (its PERFORMANCE.md): for an all-gather of ``B`` gathered bytes taking ``t``,
``algbw = B / t`` and ``busbw = algbw * (N-1)/N``; for an all-to-all of ``B`` bytes sent by each rank,
likewise ``busbw = (B / t) * (N-1)/N``. So ``ms_per_mib = t / ((N-1)/N * B / 2^20)``.

Every process of the job takes part (torch.distributed: NCCL on GPUs, gloo on CPU). For each group size
``N = 2, 4, ...`` up to the ranks of one node, the group of the first N ranks of node 0 is timed (intra
node); under a multi-node torchrun (``LOCAL_WORLD_SIZE < WORLD_SIZE``), groups of ``N = 2, 4, ...`` ranks
spread evenly over the nodes (one rank per node first, so each such group crosses nodes) are timed too
(inter node). Each size is timed ``repeats`` times after one warm-up; the median is kept, and the link's
coefficient is the slope of ``t`` over ``(N-1)/N * MiB`` fitted over the sizes (the fixed latency is the
intercept), the largest over group sizes (the slowest group bounds what a planner may assume).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from skrull.worker.profiling.comm import collective_ms

MIB = float(2**20)
ALLGATHER = "allgather"
ALLTOALL = "alltoall"
INTRA_NODE = "intra_node"
INTER_NODE = "inter_node"
#: message sizes timed (bytes of the whole collective: gathered output, or what each rank sends)
DEFAULT_SIZES_BYTES: tuple[int, ...] = (1 << 16, 1 << 18, 1 << 20, 1 << 22)


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkSample:
    """The median time of one collective of one size on one group."""

    link: str
    collective: str
    group_size: int
    num_bytes: int
    ms: float

    @property
    def bus_mib(self) -> float:
        """``(N-1)/N * bytes / 2^20``: the bus traffic a busbw figure divides."""
        return (self.group_size - 1) / self.group_size * self.num_bytes / MIB

    @property
    def busbw_gb_s(self) -> float:
        return self.bus_mib * MIB / 1e9 / (self.ms / 1e3) if self.ms > 0 else float("inf")


def node_layout() -> tuple[int, int]:
    """``(ranks per node, nodes)`` of this job: torchrun's LOCAL_WORLD_SIZE, else one node."""
    world = dist.get_world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if local < 1 or world % local != 0:
        raise ValueError(f"LOCAL_WORLD_SIZE={local} does not divide the world of {world} ranks")
    return local, world // local


def link_groups(world: int, per_node: int) -> list[tuple[str, tuple[int, ...]]]:
    """The groups timed, in the same order on every rank: ``(link, ranks)``."""
    out: list[tuple[str, tuple[int, ...]]] = []
    n = 2
    while n <= per_node:
        out.append((INTRA_NODE, tuple(range(n))))
        n *= 2
    nodes = world // per_node
    if nodes > 1:
        n = 2
        while n <= world:
            # n ranks spread over the nodes: rank i of the group on node i % nodes, local slot i // nodes
            ranks = tuple(sorted((i % nodes) * per_node + i // nodes for i in range(n)))
            if len({r // per_node for r in ranks}) > 1 and len(set(ranks)) == n:
                out.append((INTER_NODE, ranks))
            n *= 2
    return out


def _time_one(collective: str, send: torch.Tensor, group: Any, device: torch.device, repeats: int) -> float:
    return collective_ms(send, gather=collective == ALLGATHER, group=group, device=device, repeats=repeats)


def measure_links(
    device: torch.device, *, sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES, repeats: int = 5
) -> list[LinkSample]:
    """Time every group of ``link_groups`` on this job (collective: every rank calls it); rank 0's list."""
    per_node, _ = node_layout()
    world = dist.get_world_size()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    samples = []
    for link, ranks in link_groups(world, per_node):
        group = dist.new_group(ranks=list(ranks))  # collective over the whole world, members or not
        if dist.get_rank() not in ranks:
            continue
        n = len(ranks)
        for collective in (ALLGATHER, ALLTOALL):
            for size in sizes_bytes:
                per_slot = max(1, size // n // dtype.itemsize)
                if collective == ALLGATHER:  # ``size`` gathered bytes: each member brings 1/N of them
                    send = torch.ones(per_slot, dtype=dtype, device=device)
                    counted = per_slot * n * dtype.itemsize
                else:  # ``size`` bytes sent by each member, one slot of it per member
                    send = torch.ones(per_slot * n, dtype=dtype, device=device)
                    counted = per_slot * n * dtype.itemsize
                ms = _time_one(collective, send, group, device, repeats)
                samples.append(LinkSample(link=link, collective=collective, group_size=n, num_bytes=counted, ms=ms))
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, [_as_dict(s) for s in samples])
    if dist.get_rank() != 0:
        return []
    seen = set()
    out = []
    for part in gathered:  # every member timed the same thing: rank 0's view, plus groups it is not in
        for row in part:
            key = (row["link"], row["collective"], row["group_size"], row["num_bytes"])
            if key not in seen:
                seen.add(key)
                out.append(LinkSample(**row))
    return out


def _as_dict(s: LinkSample) -> dict[str, Any]:
    return {"link": s.link, "collective": s.collective, "group_size": s.group_size, "num_bytes": s.num_bytes,
            "ms": s.ms}  # fmt: skip


def fit_link(samples: Sequence[LinkSample]) -> tuple[float, float]:
    """``(ms_per_mib, fixed_ms)`` of one link and collective: per group size the slope of ``ms`` over bus MiB
    (least squares with an intercept, non-negative), the largest over group sizes, with its intercept."""
    best = (0.0, 0.0)
    for n in sorted({s.group_size for s in samples}):
        rows = [s for s in samples if s.group_size == n]
        x = np.asarray([s.bus_mib for s in rows])
        y = np.asarray([s.ms for s in rows])
        if len(rows) >= 2 and np.ptp(x) > 0:
            slope, intercept = np.polyfit(x, y, 1)
            if slope <= 0:  # latency-bound over the sizes timed: the largest size's time per MiB bounds it
                slope, intercept = float(y[-1] / x[-1]), 0.0
        else:
            slope, intercept = float(y[-1] / x[-1]), 0.0
        if slope > best[0]:
            best = (float(slope), max(0.0, float(intercept)))
    return best


def topology_section(
    samples: Sequence[LinkSample],
    *,
    gpus_per_node: int,
    nodes: int,
    device: str,
    backend: str,
    start: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The profile's ``topology`` (docs/formats.md) from measured samples; a link not measured keeps ``start``'s
    figure (and ``source`` says so), or, with none, the measured intra-node one (said too)."""
    when = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    on = f"{nodes} node(s) x {gpus_per_node} {device} rank(s), {backend}, host {platform.node()}, {when}"
    section: dict[str, Any] = {"gpus_per_node": gpus_per_node}
    notes = []
    per_size: dict[str, Any] = {}
    for link in (INTRA_NODE, INTER_NODE):
        mine = [s for s in samples if s.link == link]
        if not mine:
            continue
        figures = {}
        for collective in (ALLGATHER, ALLTOALL):
            ms_per_mib, fixed = fit_link([s for s in mine if s.collective == collective])
            figures[f"{collective}_ms_per_mib"] = ms_per_mib
            per_size[f"{link}.{collective}"] = [
                {"group_size": s.group_size, "bytes": s.num_bytes, "ms": round(s.ms, 6),
                 "busbw_gb_s": round(s.busbw_gb_s, 4)}
                for s in mine if s.collective == collective
            ]  # fmt: skip
            per_size[f"{link}.{collective}.fixed_ms"] = round(fixed, 6)
        section[link] = figures
        sizes = sorted({s.group_size for s in mine})
        notes.append(f"{link}: measured by skrull profile --links (busbw as nccl-tests defines it; groups of {sizes})")
    start_topology = (start or {}).get("topology") if start else None
    if INTER_NODE not in section:
        if start_topology and INTER_NODE in start_topology:
            section[INTER_NODE] = dict(start_topology[INTER_NODE])
            name = (start or {}).get("name", "the starting profile")
            notes.append(f"inter_node: not measured (one node: no cross-node group to time); kept from {name}")
        else:
            section[INTER_NODE] = dict(section.get(INTRA_NODE, {}))
            notes.append(
                "inter_node: not measured (one node) and no starting topology to keep: the intra-node figures "
                "stand in (a lower bound on a real cross-node link)"
            )
    if INTRA_NODE not in section:
        if start_topology and INTRA_NODE in start_topology:
            section[INTRA_NODE] = dict(start_topology[INTRA_NODE])
            notes.append("intra_node: not measured (one rank per node); kept from the starting profile")
        else:
            raise ValueError("no link was measured: run with at least 2 ranks")
    section["source"] = f"measured on {on}: " + "; ".join(notes)
    section["measured"] = per_size
    return section


def run_links(
    *, backend: str, sizes_bytes: Sequence[int], repeats: int, start: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """In an initialised process group: time the links and build ``topology`` (rank 0; None on the others)."""
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    per_node, nodes = node_layout()
    samples = measure_links(device, sizes_bytes=sizes_bytes, repeats=repeats)
    if dist.get_rank() != 0:
        return None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({platform.machine()})"
    return topology_section(samples, gpus_per_node=per_node, nodes=nodes, device=name, backend=backend, start=start)


def _spawned(
    rank: int, world_size: int, backend: str, sizes_bytes: Sequence[int], repeats: int, start: Any, out: str
) -> None:
    section = run_links(backend=backend, sizes_bytes=sizes_bytes, repeats=repeats, start=start)
    if section is not None:
        Path(out).write_text(json.dumps(section), encoding="utf-8")


def under_torchrun() -> bool:
    """Whether this process was started by torchrun (or another launcher that sets the env:// variables)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def measure_topology(
    *, num_processes: int, backend: str, sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES, repeats: int = 5,
    start: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:  # fmt: skip
    """``topology`` of this machine or job: under torchrun every process measures (rank 0 returns it, the
    others None); else ``num_processes`` processes on this machine are started for it."""
    if under_torchrun():
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        if backend == "gloo" and os.environ["MASTER_ADDR"] in ("127.0.0.1", "localhost"):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # a simulated multi-node job on one host
        dist.init_process_group(backend)
        try:
            return run_links(backend=backend, sizes_bytes=sizes_bytes, repeats=repeats, start=start)
        finally:
            dist.destroy_process_group()
    from skrull.worker.launch import launch

    with tempfile.TemporaryDirectory(prefix="skrull-links-") as tmp:
        out = Path(tmp) / "topology.json"
        launch(_spawned, world_size=num_processes, backend=backend,
               args=(tuple(sizes_bytes), repeats, dict(start) if start else None, str(out)))  # fmt: skip
        result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return result

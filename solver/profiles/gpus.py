"""GPU figures a derived profile starts from: published datasheet numbers, each with its source.

Only three numbers per GPU come from the vendor: memory, dense BF16 throughput (no 2:4 sparsity) and
the GPU-to-GPU link bandwidth (NVLink, or PCIe where a card has no NVLink; both directions summed, as
datasheets quote it). Two numbers are assumptions, stated as such:

    cp_bus_bandwidth_gbs = ACHIEVED_LINK_FRACTION * link_bandwidth_gbs
        (bus bandwidth an all-gather reaches inside one node; 0.4 reproduces ~360 GB/s on H100's 900 GB/s,
        a typical nccl-tests figure for mid-sized messages)
    dp_bandwidth_gbs = the node's network bandwidth per GPU, for ZeRO's gradient traffic across nodes
        (one 400 Gb/s NDR InfiniBand port per GPU = 50 GB/s unless noted)

Cluster topology (the profile's ``topology`` section, CONTRACT.md "Cluster topology and gathered K/V"): a
node of ``gpus_per_node`` GPUs (8 for every SXM part: DGX/HGX A100, H100, H200, B200), the inverse bus
bandwidth of all-gather and all-to-all inside a node (NVLink through NVSwitch) and across nodes (the
GPU's own InfiniBand port: DGX A100 has one 200 Gb/s HDR port per GPU, DGX H100/H200 one 400 Gb/s NDR
port, and an 800 Gb/s XDR port, NVIDIA Quantum-X800 / ConnectX-8, is taken for B200):

    intra-node all-gather busbw = cp_bus_bandwidth_gbs (above)
    intra-node all-to-all busbw = the same (assumed: both are bound by the GPU's NVLink ports through
        NVSwitch, every peer one hop away)
    inter-node busbw, both collectives = INTER_NODE_EFFICIENCY * the port's line rate (GB/s)
        (0.9: nccl-tests on NDR clusters reach ~45 GB/s bus bandwidth per 400 Gb/s port, assumed)

All-to-all across nodes is priced at one port per GPU: each GPU's traffic to other nodes leaves through
its own NIC (rail-optimised fabrics, NCCL's PXN), so the node's other NICs are never aggregated for one
GPU, and the NVLink share of the exchange (the peers inside the node) is not credited: a conservative
price, exact for a group with one GPU per node.

Memory in the datasheets' "GB" is taken as GiB (2^30 bytes), as the bundled H100 profile does; the
profile reserves a fraction of it anyway (solver/profiles/derive.py, ``TrainingSetup.reserve_fraction``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from skrull.solver.errors import RequestError
from skrull.solver.profile import Link, Topology

#: All-gather bus bandwidth reached inside one node, as a fraction of the quoted link bandwidth (assumed).
ACHIEVED_LINK_FRACTION = 0.4
#: 400 Gb/s NDR InfiniBand per GPU, in GB/s (assumed for DP traffic unless a GPU's entry says otherwise).
NDR_PER_GPU_GBS = 50.0
#: GPUs per node of every SXM part (DGX/HGX A100, H100, H200, B200 baseboards carry 8).
SXM_GPUS_PER_NODE = 8
#: Bus bandwidth that all-gather and all-to-all reach across nodes, as a fraction of the port's line rate
#: (assumed: ~45 GB/s on 400 Gb/s NDR in nccl-tests).
INTER_NODE_EFFICIENCY = 0.9
#: InfiniBand line rates per GPU port, Gb/s (NVIDIA InfiniBand generations: HDR 200, NDR 400, XDR 800).
HDR_GBITS, NDR_GBITS, XDR_GBITS = 200.0, 400.0, 800.0


class Network(TypedDict):
    """The network of a node type, as ``gpu_from_figures`` takes it: DP traffic per GPU in GB/s and the line
    rate of each GPU's inter-node port in Gb/s."""

    dp_bandwidth_gbs: float
    inter_node_gbits: float


#: One 200 Gb/s HDR InfiniBand port per GPU (DGX A100, and assumed for PCIe servers): 25 GB/s of DP traffic.
HDR_NETWORK = Network(dp_bandwidth_gbs=25.0, inter_node_gbits=HDR_GBITS)


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    name: str
    memory_bytes: int
    peak_bf16_tflops: float
    cp_bus_bandwidth_gbs: float
    dp_bandwidth_gbs: float
    source: str
    #: GPUs per node and the line rate of each GPU's inter-node port in Gb/s (``topology``; module doc).
    gpus_per_node: int = SXM_GPUS_PER_NODE
    inter_node_gbits: float = NDR_GBITS
    topology_source: str = ""


def check_figure(field: str, value: float) -> None:
    """A datasheet figure is a finite number > 0 (and below any real device's by far)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e9:
        raise RequestError(field, value, "must be a finite number > 0")


def gpu_from_figures(
    *,
    name: str,
    memory_gib: float,
    peak_bf16_tflops: float,
    link_bandwidth_gbs: float,
    dp_bandwidth_gbs: float = NDR_PER_GPU_GBS,
    source: str,
    gpus_per_node: int = SXM_GPUS_PER_NODE,
    inter_node_gbits: float = NDR_GBITS,
    topology_source: str = "",
) -> GpuSpec:
    """A spec from datasheet figures; the CP bus bandwidth is ``ACHIEVED_LINK_FRACTION`` of the link."""
    for field, value in (
        ("memory_gib", memory_gib),
        ("peak_bf16_tflops", peak_bf16_tflops),
        ("link_bandwidth_gbs", link_bandwidth_gbs),
        ("dp_bandwidth_gbs", dp_bandwidth_gbs),
    ):
        check_figure(field, value)
    if not name or "/" in name:
        raise RequestError("gpu name", name, "must be a non-empty name without '/'")
    return GpuSpec(
        name=name,
        memory_bytes=int(memory_gib * 2**30),
        peak_bf16_tflops=float(peak_bf16_tflops),
        cp_bus_bandwidth_gbs=round(ACHIEVED_LINK_FRACTION * link_bandwidth_gbs, 3),
        dp_bandwidth_gbs=float(dp_bandwidth_gbs),
        source=source,
        gpus_per_node=gpus_per_node,
        inter_node_gbits=float(inter_node_gbits),
        topology_source=topology_source,
    )


_ASSUMED = (
    f"CP all-gather bus bandwidth = {ACHIEVED_LINK_FRACTION} x the link figure (assumed); "
    "DP traffic at {dp} GB/s per GPU ({network}, assumed)"
)
_NDR = _ASSUMED.format(dp=NDR_PER_GPU_GBS, network="one 400 Gb/s NDR InfiniBand port per GPU")

GPUS: dict[str, GpuSpec] = {
    # Kept verbatim: the bundled profiles under profiles/ were derived from this entry.
    "h100-80g": GpuSpec(
        name="h100-80g",
        memory_bytes=80 * 2**30,
        peak_bf16_tflops=989.0,
        cp_bus_bandwidth_gbs=360.0,
        dp_bandwidth_gbs=50.0,
        source=(
            "NVIDIA H100 SXM5 datasheet: 80 GB HBM3, 989 dense BF16 TFLOP/s, NVLink 4 at 900 GB/s; "
            "achieved all-gather bus bandwidth ~360 GB/s within a node (nccl-tests figures, assumed); "
            "400 Gb/s NDR InfiniBand per GPU = 50 GB/s for DP gradient traffic across nodes"
        ),
        topology_source="NVIDIA DGX H100 / HGX H100: 8 H100 SXM5 per node on NVSwitch (NVLink 4, 900 GB/s per "
        "GPU), one ConnectX-7 400 Gb/s NDR InfiniBand port per GPU",
    ),
    "h200-141g": gpu_from_figures(
        name="h200-141g",
        memory_gib=141,
        peak_bf16_tflops=989.0,
        link_bandwidth_gbs=900.0,
        source="NVIDIA H200 SXM datasheet: 141 GB HBM3e, 989 dense BF16 TFLOP/s (1,979 with sparsity), "
        f"NVLink 4 at 900 GB/s; {_NDR}",
        topology_source="NVIDIA DGX H200 / HGX H200: 8 H200 SXM per node on NVSwitch (NVLink 4, 900 GB/s per "
        "GPU), one ConnectX-7 400 Gb/s NDR InfiniBand port per GPU",
    ),
    "a100-80g": gpu_from_figures(
        name="a100-80g",
        memory_gib=80,
        peak_bf16_tflops=312.0,
        link_bandwidth_gbs=600.0,
        **HDR_NETWORK,
        source="NVIDIA A100 80GB SXM datasheet: 80 GB HBM2e, 312 dense BF16 TFLOP/s (624 with sparsity), "
        "NVLink 3 at 600 GB/s; "
        + _ASSUMED.format(
            dp=HDR_NETWORK["dp_bandwidth_gbs"], network="one 200 Gb/s HDR InfiniBand port per GPU, as in DGX A100"
        ),
        topology_source="NVIDIA DGX A100: 8 A100 SXM4 per node on NVSwitch (NVLink 3, 600 GB/s per GPU), one "
        "ConnectX-6 200 Gb/s HDR InfiniBand port per GPU",
    ),
    "l40s-48g": gpu_from_figures(
        name="l40s-48g",
        memory_gib=48,
        peak_bf16_tflops=362.05,
        link_bandwidth_gbs=64.0,
        **HDR_NETWORK,
        source="NVIDIA L40S datasheet: 48 GB GDDR6, 362.05 dense BF16 TFLOP/s (733 with sparsity), no NVLink: "
        "PCIe Gen4 x16 at 64 GB/s; "
        + _ASSUMED.format(dp=HDR_NETWORK["dp_bandwidth_gbs"], network="one 200 Gb/s port per GPU"),
        topology_source="a PCIe server of 8 L40S (assumed; no NVLink, peers over PCIe Gen4 x16 at 64 GB/s), "
        "one 200 Gb/s port per GPU (assumed)",
    ),
    "b200-180g": gpu_from_figures(
        name="b200-180g",
        memory_gib=180,
        peak_bf16_tflops=2250.0,
        link_bandwidth_gbs=1800.0,
        source="NVIDIA HGX B200 datasheet: 180 GB HBM3e per GPU (1.44 TB per 8 GPUs), 2.25 dense BF16 "
        f"PFLOP/s per GPU (4.5 with sparsity), NVLink 5 at 1.8 TB/s; {_NDR}",
        inter_node_gbits=XDR_GBITS,
        topology_source="NVIDIA HGX B200: 8 B200 per node on NVSwitch (NVLink 5, 1.8 TB/s per GPU); one 800 Gb/s "
        "XDR InfiniBand port per GPU (NVIDIA Quantum-X800 / ConnectX-8, assumed; DGX B200 ships 400 Gb/s "
        "ConnectX-7 ports: --inter-gbps 45)",
    ),
}


def get_gpu(name: str) -> GpuSpec:
    if name not in GPUS:
        raise RequestError("--gpu", name, f"unknown GPU; known: {', '.join(GPUS)}")
    return GPUS[name]


def _ms_per_mib(busbw_gbs: float) -> float:
    """1 / bus bandwidth in ms per MiB (CONTRACT.md ``*_ms_per_mib``)."""
    return round(2**20 / (busbw_gbs * 1e9) * 1e3, 8)


def topology_for(
    gpu: GpuSpec,
    *,
    gpus_per_node: int | None = None,
    intra_gbps: float | None = None,
    inter_gbps: float | None = None,
) -> Topology:
    """The ``topology`` section for a cluster of ``gpu`` (module doc), each figure with its source.

    ``gpus_per_node``, ``intra_gbps`` (bus bandwidth of both collectives inside a node, GB/s) and
    ``inter_gbps`` (the same across nodes, per GPU, GB/s; note: gigaBYTES, as nccl-tests reports busbw)
    describe a user's own cluster and replace the published figures they name."""
    if gpus_per_node is not None and (
        isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1
    ):
        raise RequestError("--gpus-per-node", gpus_per_node, "must be an integer >= 1")
    for field, value in (("--intra-gbps", intra_gbps), ("--inter-gbps", inter_gbps)):
        if value is not None:
            check_figure(field, value)
    per_node = gpu.gpus_per_node if gpus_per_node is None else gpus_per_node
    intra = gpu.cp_bus_bandwidth_gbs if intra_gbps is None else float(intra_gbps)
    inter = INTER_NODE_EFFICIENCY * gpu.inter_node_gbits / 8 if inter_gbps is None else float(inter_gbps)
    parts = [gpu.topology_source or f"{gpu.name}: no published cluster figures"]
    if gpus_per_node is not None:
        parts.append(f"{per_node} GPUs per node (given)")
    parts.append(
        f"intra-node all-gather and all-to-all busbw {intra:g} GB/s "
        + (
            "(given)"
            if intra_gbps is not None
            else f"({ACHIEVED_LINK_FRACTION} x the link figure, assumed; all-to-all taken equal to all-gather, assumed)"
        )
    )
    parts.append(
        f"inter-node busbw {inter:g} GB/s per GPU for both collectives "
        + (
            "(given)"
            if inter_gbps is not None
            else f"({INTER_NODE_EFFICIENCY} x the {gpu.inter_node_gbits:g} Gb/s port, assumed)"
        )
        + "; all-to-all across nodes at one port per GPU (the node's other NICs not aggregated, the NVLink share "
        "of the exchange not credited)"
    )
    intra_ms, inter_ms = _ms_per_mib(intra), _ms_per_mib(inter)
    return Topology(
        gpus_per_node=per_node,
        intra_node=Link(allgather_ms_per_mib=intra_ms, alltoall_ms_per_mib=intra_ms),
        inter_node=Link(allgather_ms_per_mib=inter_ms, alltoall_ms_per_mib=inter_ms),
        source="; ".join(parts),
    )

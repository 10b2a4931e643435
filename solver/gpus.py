"""GPU figures a derived profile starts from: published datasheet numbers, each with its source.

Only three numbers per GPU come from the vendor: memory, dense BF16 throughput (no 2:4 sparsity) and
the GPU-to-GPU link bandwidth (NVLink, or PCIe where a card has no NVLink; both directions summed, as
datasheets quote it). Two numbers are assumptions, stated as such:

    cp_bus_bandwidth_gbs = ACHIEVED_LINK_FRACTION * link_bandwidth_gbs
        (bus bandwidth an all-gather reaches inside one node; 0.4 reproduces ~360 GB/s on H100's 900 GB/s,
        a typical nccl-tests figure for mid-sized messages)
    dp_bandwidth_gbs = the node's network bandwidth per GPU, for ZeRO's gradient traffic across nodes
        (one 400 Gb/s NDR InfiniBand port per GPU = 50 GB/s unless noted)

Memory in the datasheets' "GB" is taken as GiB (2^30 bytes), as the bundled H100 profile does; the
profile reserves a fraction of it anyway (solver/derive.py, ``TrainingSetup.reserve_fraction``).
"""

from __future__ import annotations

from dataclasses import dataclass

from skrull.solver.errors import RequestError

#: All-gather bus bandwidth reached inside one node, as a fraction of the quoted link bandwidth (assumed).
ACHIEVED_LINK_FRACTION = 0.4
#: 400 Gb/s NDR InfiniBand per GPU, in GB/s (assumed for DP traffic unless a GPU's entry says otherwise).
NDR_PER_GPU_GBS = 50.0


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    name: str
    memory_bytes: int
    peak_bf16_tflops: float
    cp_bus_bandwidth_gbs: float
    dp_bandwidth_gbs: float
    source: str


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
    ),
    "h200-141g": gpu_from_figures(
        name="h200-141g",
        memory_gib=141,
        peak_bf16_tflops=989.0,
        link_bandwidth_gbs=900.0,
        source="NVIDIA H200 SXM datasheet: 141 GB HBM3e, 989 dense BF16 TFLOP/s (1,979 with sparsity), "
        f"NVLink 4 at 900 GB/s; {_NDR}",
    ),
    "a100-80g": gpu_from_figures(
        name="a100-80g",
        memory_gib=80,
        peak_bf16_tflops=312.0,
        link_bandwidth_gbs=600.0,
        dp_bandwidth_gbs=25.0,
        source="NVIDIA A100 80GB SXM datasheet: 80 GB HBM2e, 312 dense BF16 TFLOP/s (624 with sparsity), "
        "NVLink 3 at 600 GB/s; "
        + _ASSUMED.format(dp=25.0, network="one 200 Gb/s HDR InfiniBand port per GPU, as in DGX A100"),
    ),
    "l40s-48g": gpu_from_figures(
        name="l40s-48g",
        memory_gib=48,
        peak_bf16_tflops=362.05,
        link_bandwidth_gbs=64.0,
        dp_bandwidth_gbs=25.0,
        source="NVIDIA L40S datasheet: 48 GB GDDR6, 362.05 dense BF16 TFLOP/s (733 with sparsity), no NVLink: "
        "PCIe Gen4 x16 at 64 GB/s; " + _ASSUMED.format(dp=25.0, network="one 200 Gb/s port per GPU"),
    ),
    "b200-180g": gpu_from_figures(
        name="b200-180g",
        memory_gib=180,
        peak_bf16_tflops=2250.0,
        link_bandwidth_gbs=1800.0,
        source="NVIDIA HGX B200 datasheet: 180 GB HBM3e per GPU (1.44 TB per 8 GPUs), 2.25 dense BF16 "
        f"PFLOP/s per GPU (4.5 with sparsity), NVLink 5 at 1.8 TB/s; {_NDR}",
    ),
}


def get_gpu(name: str) -> GpuSpec:
    if name not in GPUS:
        raise RequestError("--gpu", name, f"unknown GPU; known: {', '.join(GPUS)}")
    return GPUS[name]

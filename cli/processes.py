"""The options and checks every command that spawns one process per GPU shares (execute, finetune).

``--request``/``--solver`` give the plan's request, ``--world-size`` must equal ``dp * cp``, the backend
must be runnable here (gloo on CPU, NCCL with one GPU per process), and the dtype and kernel must be known
and usable on that backend. torch is imported only when the checks run.

Each microbatch runs in the CP mode its plan gives it (what the cost model priced): ``--cp-modes`` says which
modes the plan may use, and no run-level setting overrides a microbatch (the old ``--cp-mode`` is refused,
naming what to use instead).
"""

from __future__ import annotations

import argparse
from typing import Any

from skrull.solver.cp_modes import ULYSSES, read_cp_modes
from skrull.solver.errors import RequestError
from skrull.solver.io import read_json, request_from_dict
from skrull.solver.types import Request

#: Default ``--tolerance``: float32 runs match the float64 reference to ~1e-6; 16-bit floats keep 8 (bf16)
#: or 11 (fp16) mantissa bits, so their outputs differ from it by ~1e-2 after a layer
#: (``skrull execute``) or a training step (``skrull finetune``).
TOLERANCE_FLOAT32 = 1e-4
TOLERANCE_16_BIT = 5e-2


class RemovedCpMode(argparse.Action):
    """``--cp-mode``, a run-level override of the plan's modes, is gone: the usage error says what to use."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        parser.error(
            f"{option_string} was removed: each microbatch runs in the mode its plan gives it; to run "
            f"{ULYSSES}, plan with --cp-modes {ULYSSES} (the request's cp_modes)"
        )


def add_process_arguments(p: Any) -> None:
    p.add_argument("--request", "-r", required=True, metavar="FILE", help="request JSON (docs/formats.md format)")
    p.add_argument("--solver", "-s", default=None, help="planner (default: the request's)")
    p.add_argument("--world-size", "-w", type=int, default=None, help="processes, = dp * cp (default: dp * cp)")
    p.add_argument("--backend", default="gloo", help="gloo (CPU) or nccl (one GPU per process); default gloo")
    p.add_argument(
        "--cp-modes",
        default=None,
        metavar="MODES",
        help="comma-separated modes the plan may run sharded attention in: allgather (Llama 3), ulysses "
        "(all-to-all); each microbatch runs in its plan's mode (default: the request's, else allgather)",
    )
    p.add_argument("--cp-mode", action=RemovedCpMode, help=argparse.SUPPRESS)
    p.add_argument("--kernel", default=None, help="flash-attn, torch-varlen, sdpa or reference (default: best)")
    p.add_argument("--dtype", default="float32", help="float32 (default), bfloat16 or float16 (nccl only)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs (default 0)")


def request_for_processes(args: argparse.Namespace) -> tuple[Request, int]:
    """``(request, world_size)`` once every shared option is checked (one clear error otherwise)."""
    import torch

    from skrull.worker.kernels import select_kernel
    from skrull.worker.launch import check_backend
    from skrull.worker.layer_check import DTYPES

    doc = read_json(args.request, field="--request")
    if isinstance(doc, dict) and args.solver is not None:
        doc["solver"] = args.solver
    if isinstance(doc, dict) and args.cp_modes is not None:
        doc["cp_modes"] = list(read_cp_modes(args.cp_modes.split(","), "--cp-modes"))
    request = request_from_dict(doc)
    num_gpus = request.parallel.num_gpus
    world_size = num_gpus if args.world_size is None else args.world_size
    if world_size != num_gpus:
        raise RequestError("--world-size", world_size, f"must equal parallel.dp * parallel.cp = {num_gpus}")
    check_backend(args.backend, world_size)
    if args.dtype not in DTYPES:
        raise RequestError("--dtype", args.dtype, f"unknown; known: {', '.join(DTYPES)}")
    if args.backend == "gloo" and args.dtype != "float32":
        raise RequestError("--dtype", args.dtype, "gloo runs on CPU: use float32")
    select_kernel(torch.device("cuda" if args.backend == "nccl" else "cpu"), DTYPES[args.dtype], args.kernel)
    return request, world_size


def plan_modes(plan: Any) -> str:
    """The CP modes the plan's communicating microbatches run in (what a run's summary line says)."""
    modes = sorted({mb.mode for it in plan.iterations for mb in it.microbatches if mb.sharded and len(mb.ranks) > 1})
    return "+".join(modes) if modes else "none"

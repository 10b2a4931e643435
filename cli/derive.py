"""``skrull derive-profile``: a profile for any dense model and GPU, derived from their published figures.

The model is a built-in shape (``--model``) or a Hugging Face ``config.json`` (``--hf-config``); the GPU
is a bundled spec (``--gpu``, see solver/profiles/gpus.py) or datasheet figures on the command line
(``--peak-tflops``, ``--link-gbps``, ``--memory-gib``), which may also override a bundled spec. The
result is an estimate (``estimated: true``) until ``skrull profile`` measures the real machine.

    skrull derive-profile --hf-config path/to/config.json --gpu a100-80g --output-dir my-profiles
    SKRULL_PROFILES_DIR=my-profiles skrull plan --dataset sharegpt --profile a100-80g/<model>

``--tp N`` prices one GPU of an N-way tensor-parallel group (solver/profiles/derive.py) in a profile named
``<gpu>/<model>-tpN``; N = 1 (the default) is the plain profile.

The bucket is derived from the model's shape and the training setup; ``--paper-bucket`` takes Skrull's
measured bucket instead where the paper gives one for a model of this shape (``memory.bucket_rule`` says
which). ``topology`` is the GPU's published cluster figures (solver/profiles/gpus.py) unless ``--gpus-per-node``,
``--intra-gbps`` or ``--inter-gbps`` (bus bandwidth in GB/s, as nccl-tests reports it) describe your own.
The bundled profiles are written with ``--paper-bucket`` (``make profiles``), so they keep the paper's setups.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from skrull.solver.errors import RequestError
from skrull.solver.io import dumps, read_json
from skrull.solver.profile import Topology, profile_file_name, profiles_dir
from skrull.solver.profiles.derive import MODELS, ModelConfig, TrainingSetup, derive_profile, setup_of
from skrull.solver.profiles.gpus import (
    ACHIEVED_LINK_FRACTION,
    GPUS,
    NDR_PER_GPU_GBS,
    GpuSpec,
    check_figure,
    get_gpu,
    gpu_from_figures,
    topology_for,
)
from skrull.solver.profiles.hf_config import default_model_name, model_from_hf_config

DEFAULT_GPU = "h100-80g"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("derive-profile", help="derive a profile from a model config and GPU figures")
    model = p.add_argument_group("model: a built-in shape or a Hugging Face config.json")
    model.add_argument("--model", default=None, help=f"built-in: {', '.join(MODELS)} (default qwen2.5-0.5b)")
    model.add_argument("--hf-config", metavar="FILE", help="config.json of a Llama/Mistral/Qwen2/Qwen3/Gemma model")
    model.add_argument("--name", default=None, help="model name in the profile (default: from the config)")
    model.add_argument("--all", action="store_true", help="every built-in model")
    gpu = p.add_argument_group("GPU: a bundled spec, or datasheet figures (which also override a bundled spec)")
    gpu.add_argument("--gpu", default=None, help=f"one of {', '.join(GPUS)} (default {DEFAULT_GPU})")
    gpu.add_argument("--peak-tflops", type=float, default=None, help="dense BF16 TFLOP/s (no sparsity)")
    gpu.add_argument(
        "--link-gbps", "--nvlink-gbps", dest="link_gbps", type=float, default=None, help="GPU link GB/s (NVLink/PCIe)"
    )
    gpu.add_argument("--memory-gib", type=float, default=None, help="device memory in GiB")
    gpu.add_argument(
        "--dp-gbps", type=float, default=None, help=f"network GB/s per GPU for DP (default {NDR_PER_GPU_GBS})"
    )
    gpu.add_argument("--gpu-name", default=None, help="GPU name in the profile (default: --gpu, else custom)")
    cluster = p.add_argument_group("cluster (default: the GPU's published NVLink and InfiniBand figures)")
    cluster.add_argument("--gpus-per-node", type=int, default=None, help="GPUs in one node (default 8 for SXM parts)")
    cluster.add_argument(
        "--intra-gbps", type=float, default=None, help="all-gather/all-to-all bus bandwidth inside a node, GB/s"
    )
    cluster.add_argument(
        "--inter-gbps", type=float, default=None, help="all-gather/all-to-all bus bandwidth across nodes per GPU, GB/s"
    )
    run = p.add_argument_group("training setup (defaults: Skrull section 5.1)")
    run.add_argument("--dp", type=int, default=None, help="data-parallel degree ZeRO splits states over (default 4)")
    run.add_argument("--zero-stage", type=int, default=None, choices=(0, 1, 2, 3), help="ZeRO stage (default 2)")
    run.add_argument("--mfu", type=float, default=None, help="model FLOP utilisation, 0..1 (default 0.30)")
    run.add_argument(
        "--tp",
        type=int,
        default=1,
        help="tensor-parallel degree (Megatron-style, sequence parallel): price one GPU of a TP group "
        "(must divide the attention heads and MLP width; default 1: none)",
    )
    run.add_argument(
        "--paper-bucket",
        action="store_true",
        help="use Skrull's measured bucket where the paper gives one for this model shape (Qwen2.5-0.5B/7B, "
        "default setup), scaled by free memory; default: the derived bucket",
    )
    out = p.add_argument_group("output")
    out.add_argument("--output", "-o", metavar="FILE", help="write the profile here (default: stdout)")
    out.add_argument("--output-dir", metavar="DIR", help="write <gpu>__<model>.json here (for SKRULL_PROFILES_DIR)")
    out.add_argument("--write-bundled", action="store_true", help="(re)write the bundled files under profiles/")
    p.set_defaults(func=cmd_derive_profile)


def gpu_from_args(args: argparse.Namespace) -> GpuSpec:
    """``--gpu`` with any figures given on top; without ``--gpu``, the three figures are all required."""
    figures = {"peak_tflops": args.peak_tflops, "link_gbps": args.link_gbps, "memory_gib": args.memory_gib}
    given = {k: v for k, v in figures.items() if v is not None}
    for key, value in (*given.items(), ("dp_gbps", args.dp_gbps)):
        if value is not None:
            check_figure(f"--{key.replace('_', '-')}", value)
    if args.gpu_name is not None and (not args.gpu_name or "/" in args.gpu_name):
        raise RequestError("--gpu-name", args.gpu_name, "must be a non-empty name without '/'")
    if args.gpu is None and not given and args.dp_gbps is None:
        return get_gpu(DEFAULT_GPU)
    if args.gpu is None:
        missing = [f"--{k.replace('_', '-')}" for k in figures if k not in given]
        if missing:
            raise RequestError(
                missing[0], None, "required without --gpu (with --peak-tflops, --link-gbps, --memory-gib)"
            )
        return gpu_from_figures(
            name=args.gpu_name or "custom",
            memory_gib=args.memory_gib,
            peak_bf16_tflops=args.peak_tflops,
            link_bandwidth_gbs=args.link_gbps,
            dp_bandwidth_gbs=NDR_PER_GPU_GBS if args.dp_gbps is None else args.dp_gbps,
            source=f"given on the command line: {_figures_text(args)}",
        )
    base = get_gpu(args.gpu)
    if not given and args.dp_gbps is None and args.gpu_name is None:
        return base
    return dataclasses.replace(
        base,
        name=args.gpu_name or f"{base.name}-custom",
        memory_bytes=base.memory_bytes if args.memory_gib is None else int(args.memory_gib * 2**30),
        peak_bf16_tflops=args.peak_tflops or base.peak_bf16_tflops,
        cp_bus_bandwidth_gbs=base.cp_bus_bandwidth_gbs
        if args.link_gbps is None
        else round(ACHIEVED_LINK_FRACTION * args.link_gbps, 3),
        dp_bandwidth_gbs=args.dp_gbps or base.dp_bandwidth_gbs,
        source=f"{base.source}; overridden on the command line: {_figures_text(args)}",
    )


def topology_from_args(gpu: GpuSpec, args: argparse.Namespace) -> Topology:
    """The GPU's published cluster figures with ``--gpus-per-node``, ``--intra-gbps``, ``--inter-gbps`` on top."""
    return topology_for(gpu, gpus_per_node=args.gpus_per_node, intra_gbps=args.intra_gbps, inter_gbps=args.inter_gbps)


def _figures_text(args: argparse.Namespace) -> str:
    parts = [
        f"{label} {value}"
        for label, value in (
            ("peak dense BF16 TFLOP/s", args.peak_tflops),
            ("link GB/s", args.link_gbps),
            ("memory GiB", args.memory_gib),
            ("DP network GB/s", args.dp_gbps),
        )
        if value is not None
    ]
    return ", ".join(parts)


def setup_for(model: ModelConfig, args: argparse.Namespace) -> TrainingSetup:
    setup = setup_of(model)
    if args.dp is not None:
        if args.dp < 1:
            raise RequestError("--dp", args.dp, "must be an integer >= 1")
        setup = dataclasses.replace(setup, dp=args.dp)
    if args.zero_stage is not None:
        setup = dataclasses.replace(setup, zero_stage=args.zero_stage)
    if args.mfu is not None:
        if not 0 < args.mfu <= 1:
            raise RequestError("--mfu", args.mfu, "must be a fraction in (0, 1]")
        setup = dataclasses.replace(setup, mfu=args.mfu)
    if args.tp != 1:  # checked against the model by derive_profile (solver/profiles/derive.py check_tp)
        setup = dataclasses.replace(setup, tp=args.tp)
    return setup


def models_from_args(args: argparse.Namespace) -> list[ModelConfig]:
    chosen = [
        flag for flag, on in (("--model", args.model), ("--hf-config", args.hf_config), ("--all", args.all)) if on
    ]
    if len(chosen) > 1:
        raise RequestError(chosen[1], f"with {chosen[0]}", "give only one of --model, --hf-config, --all")
    if args.hf_config:
        path = Path(args.hf_config)
        doc = read_json(path, field="--hf-config")
        name = args.name or default_model_name(doc if isinstance(doc, dict) else {}, path)
        return [model_from_hf_config(doc, name=name, where=str(path.name))]
    names = list(MODELS) if args.all else [args.model or "qwen2.5-0.5b"]
    for name in names:
        if name not in MODELS:
            raise RequestError("--model", name, f"unknown model; known: {', '.join(MODELS)} (or --hf-config FILE)")
    models = [MODELS[name] for name in names]
    return [dataclasses.replace(m, name=args.name) for m in models] if args.name else models


def cmd_derive_profile(args: argparse.Namespace) -> int:
    if args.write_bundled and (args.hf_config or args.output or args.output_dir):
        raise RequestError("--write-bundled", True, "rewrites the bundled built-in profiles only; use --output-dir")
    if args.write_bundled and args.tp != 1:
        raise RequestError("--tp", args.tp, "the bundled profiles are for tp 1; write TP profiles with --output-dir")
    if args.all and args.output:
        raise RequestError("--output", args.output, "one file cannot hold every model; use --output-dir")
    gpu = gpu_from_args(args)
    topology = topology_from_args(gpu, args)
    for model in models_from_args(args):
        profile = derive_profile(model, gpu, setup_for(model, args), paper_bucket=args.paper_bucket, topology=topology)
        if profile.bucket_tokens < 1:
            static_gib = profile.extra["memory"]["static_bytes"] / 2**30
            raise RequestError(
                "--gpu",
                gpu.name,
                f"{model.name} does not fit: {static_gib:.1f} GiB of weights, gradients and optimizer states "
                f"per GPU leave no room for activations (raise --dp, --zero-stage or --tp)",
            )
        text = dumps(profile.to_dict())
        target = _target(profile.name, args)
        if target is None:
            sys.stdout.write(text + "\n")
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text + "\n", encoding="utf-8")
            print(f"wrote {target}")
    return 0


def _target(profile_name: str, args: argparse.Namespace) -> Path | None:
    if args.write_bundled:
        return profiles_dir() / profile_file_name(profile_name)
    if args.output_dir:
        return Path(args.output_dir) / profile_file_name(profile_name)
    return Path(args.output) if args.output else None

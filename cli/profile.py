"""``skrull profile``: measure this GPU for a model and write a profile; ``--check PROFILE``: how well it predicts.

Measuring needs a CUDA GPU; without one the command says so in one line and exits 2 (``--device cpu``
runs the same pipeline on the CPU with a small model, to exercise it, not to profile anything real).
torch is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from skrull.cli.flags import add_progress_flag
from skrull.solver.errors import RequestError, SkrullError
from skrull.solver.io import dumps, parse_profile, read_json
from skrull.solver.profiles.derive import TrainingSetup
from skrull.solver.types import Parallel

EXIT_USER_ERROR = 2


#: The median relative error a recorded check passes under when no --max-median-error is given.
RECORD_LIMIT = 0.15


def add_parser(sub: Any) -> None:
    p = sub.add_parser("profile", help="measure this GPU for a model and write a profile; --check PROFILE")
    p.add_argument("--check", metavar="PROFILE", default=None, help="check a profile's predictions on this device")
    p.add_argument(
        "--links",
        action="store_true",
        help="measure all-gather and all-to-all bus bandwidth per group size (inside a node; across nodes under a "
        "multi-node torchrun) and write the profile's topology (docs/profiles.md)",
    )
    p.add_argument(
        "--base",
        metavar="PROFILE",
        default=None,
        help="with --links: the profile (name or file) the topology is written into; its inter_node is kept "
        "where no cross-node group can be timed (default: write the topology section alone)",
    )
    p.add_argument("--model", default="qwen2.5-0.5b", help="model shape (qwen2.5-0.5b, qwen2.5-7b, ...; tiny)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (pipeline dry run only)")
    p.add_argument("--dtype", default=None, help="bfloat16 on cuda, float32 on cpu by default")
    p.add_argument("--kernel", default=None, help="attention kernel (default: best available)")
    p.add_argument("--max-tokens", type=int, default=None, help="longest pack measured (16384 on cuda, 512 on cpu)")
    p.add_argument(
        "--compile",
        choices=("auto", "on", "off"),
        default="auto",
        help="time the layer compiled as the fast step runs it (auto: on cuda only)",
    )
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per measurement (median)")
    p.add_argument("--gpus", type=int, default=1, help="GPUs for the communication measurement (default 1: none)")
    p.add_argument("--memory-gib", type=float, default=None, help="device memory (default: what the GPU reports)")
    p.add_argument("--train-dp", type=int, default=4, help="DP degree for static memory under ZeRO (default 4)")
    p.add_argument("--zero-stage", type=int, default=2, help="ZeRO stage for static memory (default 2)")
    p.add_argument("--name", default=None, help="profile name (default <device>/<model>)")
    p.add_argument("--output", "-o", metavar="FILE", help="write the profile here (default: stdout)")
    add_progress_flag(p)
    chk = p.add_argument_group("--check")
    chk.add_argument("--dataset", default="chatqa2-long-sft,llama3-sft-mix", help="comma-separated distributions")
    chk.add_argument("--solvers", default="skrull,deepspeed", help="comma-separated planners")
    chk.add_argument("--dp", type=int, default=1, help="data-parallel degree of the checked plans (default 1)")
    chk.add_argument("--cp", type=int, default=8, help="context-parallel degree of the checked plans (default 8)")
    chk.add_argument("--per-rank", type=int, default=16, help="sequences per DP rank")
    chk.add_argument("--bucket-tokens", type=int, default=None, help="override the profile's bucket")
    chk.add_argument("--seed", type=int, default=0, help="sampling seed of the checked batches (default 0)")
    chk.add_argument(
        "--measure",
        choices=("auto", "layers", "microbatches"),
        default="auto",
        help="what is measured per rank part: one layer's compute x layers (layers), or a whole microbatch "
        "priced with microbatch_ms (microbatches); auto: microbatches for a calibrated profile (default)",
    )
    chk.add_argument(
        "--max-median-error",
        type=float,
        default=None,
        metavar="FRACTION",
        help="exit 1 when the overall median relative error exceeds this (e.g. 0.15)",
    )
    chk.add_argument(
        "--record",
        action="store_true",
        help="write the result into the profile file as its check block (limit: --max-median-error, else 0.15)",
    )
    p.set_defaults(func=cmd_profile)


def cmd_profile(args: argparse.Namespace) -> int:
    try:
        import torch

        from skrull.worker.compiling import resolve_compile
        from skrull.worker.layer_check import DTYPES
        from skrull.worker.profiling.document import model_from_doc
        from skrull.worker.profiling.measure import PROFILE_MODELS
        from skrull.worker.profiling.run import ProfileOptions, run_check, run_profile
    except ImportError as exc:
        raise SkrullError(f"skrull profile needs torch ({exc.name} missing): pip install 'skrull[worker]'") from None
    if args.device not in ("cuda", "cpu"):
        raise RequestError("--device", args.device, "must be cuda or cpu")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise RequestError(
            "--device",
            "cuda",
            "skrull profile measures a CUDA GPU and none is available here "
            "(--device cpu --model tiny only dry-runs the pipeline)",
        )
    device = torch.device(args.device)
    if device.type == "cpu":  # a dry run: one thread keeps timings sane on a shared, oversubscribed CPU
        torch.set_num_threads(1)
    dtype_name = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    if dtype_name not in DTYPES:
        raise RequestError("--dtype", dtype_name, f"unknown; known: {', '.join(DTYPES)}")
    dtype = DTYPES[dtype_name]
    for flag, value in (("--repeats", args.repeats), ("--gpus", args.gpus), ("--dp", args.dp), ("--cp", args.cp)):
        if value < 1:
            raise RequestError(flag, value, "must be an integer >= 1")
    if device.type == "cuda" and args.gpus > torch.cuda.device_count():
        raise RequestError("--gpus", args.gpus, f"only {torch.cuda.device_count()} GPU(s) visible")
    if args.max_median_error is not None and not args.max_median_error > 0:
        raise RequestError("--max-median-error", args.max_median_error, "must be a fraction > 0")
    if args.links:
        return _links(args, device=device)
    if args.check:
        return _check(args, device=device, dtype=dtype, model_from_doc=model_from_doc, run_check=run_check)
    if args.model not in PROFILE_MODELS:
        raise RequestError("--model", args.model, f"unknown model; known: {', '.join(PROFILE_MODELS)}")
    max_tokens = args.max_tokens or (16384 if device.type == "cuda" else 512)
    if max_tokens < 128:
        raise RequestError("--max-tokens", max_tokens, "must be >= 128")
    capacity = (
        args.memory_gib * 2**30 if args.memory_gib is not None else (None if device.type == "cuda" else 80 * 2**30)
    )
    options = ProfileOptions(
        model=PROFILE_MODELS[args.model],
        device=device,
        dtype=dtype,
        max_tokens=max_tokens,
        name=args.name,
        kernel=args.kernel,
        repeats=args.repeats,
        num_gpus=args.gpus,
        capacity_bytes=capacity,
        setup=TrainingSetup(dp=args.train_dp, zero_stage=args.zero_stage),
        progress=args.progress,
        compile=resolve_compile(args.compile, device),
    )
    doc = run_profile(options)
    parse_profile(doc)  # the specification's reader must accept what we write
    text = dumps(doc)
    if args.output:
        Path(args.output).write_text(text + "\n", encoding="utf-8")
        c, m = doc["compute"], doc["memory"]
        print(
            f"wrote {args.output}: {doc['name']} on {doc['measured']['device']}; ms_per_tflop {c['ms_per_tflop']:.4g}, "
            f"fixed_ms {c['fixed_ms']:.4g} (R^2 {c['r2']:.3f}); bucket_tokens {m['bucket_tokens']}"
        )
    else:
        sys.stdout.write(text + "\n")
    return 0


def _links(args: argparse.Namespace, *, device: Any) -> int:
    """``skrull profile --links``: the ``topology`` section measured on this machine or torchrun job."""
    from skrull.solver.profile import bundled_profile_names, load_profile
    from skrull.worker.profiling.links import measure_topology, under_torchrun

    start: dict[str, Any] | None = None
    if args.base is not None:
        if args.base in bundled_profile_names():
            start = load_profile(args.base).to_dict()
        else:
            doc = read_json(args.base, field="--base")
            parse_profile(doc, field="--base")
            start = doc
    if not under_torchrun() and args.gpus < 2:
        raise RequestError("--gpus", args.gpus, "--links times groups of at least 2 processes: give --gpus >= 2")
    section = measure_topology(
        num_processes=args.gpus, backend="nccl" if device.type == "cuda" else "gloo", repeats=args.repeats,
        start=start,
    )  # fmt: skip
    if section is None:  # a torchrun rank other than 0: rank 0 writes
        return 0
    doc = dict(start) if start is not None else {}
    doc["topology"] = section
    if start is not None:
        parse_profile(doc)  # the specification's reader must accept what we write
    text = dumps(doc)
    if args.output:
        Path(args.output).write_text(text + "\n", encoding="utf-8")
        intra, inter = section["intra_node"], section["inter_node"]
        print(
            f"wrote {args.output}: topology of {section['gpus_per_node']} rank(s) per node; intra_node all-gather "
            f"{intra['allgather_ms_per_mib']:.4g} / all-to-all {intra['alltoall_ms_per_mib']:.4g} ms per MiB; "
            f"inter_node {inter['allgather_ms_per_mib']:.4g} / {inter['alltoall_ms_per_mib']:.4g}"
        )
    else:
        sys.stdout.write(text + "\n")
    return 0


def _check(args: argparse.Namespace, *, device: Any, dtype: Any, model_from_doc: Any, run_check: Any) -> int:
    from skrull.worker.compiling import resolve_compile

    doc = read_json(args.check, field="--check")
    profile = parse_profile(doc, field="--check")
    try:
        model = model_from_doc(doc.get("model") if isinstance(doc, dict) else None)
    except ValueError as exc:
        raise RequestError("--check", args.check, f"{exc}; --check needs the model shape") from None
    from skrull.worker.profiling.check import check_measure

    measure = check_measure(doc, args.measure)
    datasets = [d for d in args.dataset.split(",") if d]
    solvers = [s for s in args.solvers.split(",") if s]
    rows = run_check(
        profile,
        model,
        device=device,
        dtype=dtype,
        datasets=datasets,
        solvers=solvers,
        parallel=Parallel(dp=args.dp, cp=args.cp),
        sequences_per_rank=args.per_rank,
        seed=args.seed,
        repeats=args.repeats,
        kernel=args.kernel,
        bucket_tokens=args.bucket_tokens,
        progress=args.progress,
        compile=resolve_compile(args.compile, device),
        measure=measure,
    )
    from skrull.worker.profiling.check import check_stats

    what = (
        "every rank's compute of the first iteration, measured in turn on this device"
        if measure == "layers"
        else "every rank's microbatches of the first iteration run whole (layers, head, backward; host time "
        "included), in turn on this device, priced with microbatch_ms and without communication"
    )
    head = f"check of {profile.name} on {device}: DP{args.dp} x CP{args.cp}, {args.per_rank} sequences per DP rank"
    print(f"{head}, {what}")
    print()
    print("| dataset | solver | predicted max rank ms | measured max rank ms | median abs err | R^2 |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        st = row.stats
        print(
            f"| {row.dataset} | {row.solver} | {max(row.predicted_ms):.2f} | {max(row.measured_ms):.2f} "
            f"| {st.median_abs_rel_error:.1%} | {st.r2:.3f} |"
        )
    overall = check_stats([p for r in rows for p in r.predicted_ms], [m for r in rows for m in r.measured_ms])
    # the figure printed is the figure recorded (4 decimals): a raw 0.12953 would print 13.0% and record 12.9%
    median = round(overall.median_abs_rel_error, 4)
    print()
    print(
        f"overall: median abs error {median:.1%} ({overall.median_abs_error_ms:.3f} ms), "
        f"worst {overall.max_abs_rel_error:.1%}, R^2 {overall.r2:.3f} over {overall.n} rank-iterations"
    )
    by_dataset: dict[str, dict[str, float]] = {}
    for row in rows:
        by_dataset.setdefault(row.dataset, {})[row.solver] = max(row.measured_ms)
    for dataset, times in by_dataset.items():
        if "skrull" in times and "deepspeed" in times and times["skrull"] > 0:
            print(
                f"{dataset}: measured iteration compute (slowest rank) skrull {times['skrull']:.2f} ms vs "
                f"deepspeed {times['deepspeed']:.2f} ms: {times['deepspeed'] / times['skrull']:.2f}x"
            )
    limit = args.max_median_error
    if args.record:
        from skrull.worker.profiling.check import check_block, check_what

        doc["check"] = check_block(
            median_abs_rel_error=median,
            limit=limit if limit is not None else RECORD_LIMIT,
            what=check_what(
                datasets=datasets,
                solvers=solvers,
                dp=args.dp,
                cp=args.cp,
                sequences_per_rank=args.per_rank,
                measure=measure,
            ),
        )
        Path(args.check).write_text(dumps(doc) + "\n", encoding="utf-8")  # as the profile was written
    if limit is not None and not median <= limit:
        print(
            f"skrull: error: check failed: median relative error {median:.1%} > {limit:.1%}",
            file=sys.stderr,
        )
        return 1
    return 0

"""Eager vs compiled planned step: tokens/s and MFU of one microbatch's forward and backward.

For each token count, one microbatch (packed sequences of ``--seq-tokens`` tokens each, or one sequence
when the count is smaller) runs as the fast step runs it: DACP attention with the chosen kernel, the
LM head's fused chunked cross-entropy (worker/fused_ce.py), backward. First with the decoder layers
eager, then compiled regionally (worker/compiling.py: two graphs per layer around the eager attention),
then each layer as one graph (``fullgraph``: the attention a registered operator, worker/attention_op.py),
then the whole decoder as one graph (``stack``), each mode on a fresh model with the same weights
(``--modes``; ``cudagraphs``, CUDA only and not in the default, replays the one-graph layers as CUDA graphs).
``--warmup`` untimed runs (the compiled one's first run compiles), then the median of ``--repeats`` timed
runs (CUDA events).

MFU (PaLM, Chowdhery et al. 2022, appendix B): model FLOPs over the device's peak, with
``6 N + 12 L q S`` FLOPs per token of a sequence of ``S`` tokens (``N``: the layers' and the head's
matmul parameters, ``L`` layers, ``q`` the query width), full (not causal-halved) attention; peak:
``--peak-tflops`` (default the bf16 dense peak of solver/profiles/gpus.py's h100-80g, 989 TFLOP/s).

``--layers N`` keeps the first N decoder layers at the full model's dimensions (a 7B shape on one GPU
without its whole memory). ``--device cpu`` runs the same code on tiny shapes (a smoke test).

    python bench/fast_step.py --model-config examples/models/qwen2.5-0.5b.json --tokens 1024,4096,16384 \
        --out docs/gpu-check/fast-step-qwen2.5-0.5b.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from skrull.solver.profiles.gpus import GPUS  # noqa: E402
from skrull.worker.compiling import compile_count  # noqa: E402
from skrull.worker.dacp import DACPPlan  # noqa: E402
from skrull.worker.dataloader import ready_microbatch  # noqa: E402
from skrull.worker.hf.fast import compile_model  # noqa: E402
from skrull.worker.hf.inputs import model_inputs  # noqa: E402
from skrull.worker.hf.model import build_model, read_model_config  # noqa: E402
from skrull.worker.hf.step import causal_lm_loss  # noqa: E402
from skrull.worker.inputs import SyntheticData  # noqa: E402
from skrull.worker.kernels import kernel_choice  # noqa: E402
from skrull.worker.layout import MicrobatchLayout  # noqa: E402
from skrull.worker.profiling.measure import repeat_ms  # noqa: E402

#: ``--modes``: eager layers, the regional compile (two graphs per layer around the eager attention), and
#: one graph per layer with the attention as the registered operator (worker/attention_op.py).
#: ``cudagraphs`` (CUDA only) replays those graphs as CUDA graphs (worker/compiling.py, ``cudagraph_options``).
#: ``stack`` compiles the whole decoder (embedding, every layer, final norm) as one graph.
MODES: dict[str, str | None] = {
    "eager": None,
    "compiled": "on",
    "fullgraph": "fullgraph",
    "stack": "stack",
    "cudagraphs": "cudagraphs",
}


def matmul_params(config: dict[str, Any]) -> tuple[int, int, int]:
    """(N, layers, query width): the decoder layers' and the head's matmul parameters."""
    h, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or h // heads)
    q, kv = heads * head_dim, int(config.get("num_key_value_heads", heads)) * head_dim
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * int(config["intermediate_size"])
    return layers * per_layer + h * int(config["vocab_size"]), layers, q


def model_flops(config: dict[str, Any], lengths: list[int]) -> float:
    """``sum_S (6 N S + 12 L q S^2)``: PaLM's model FLOPs of training on sequences of ``lengths``."""
    n, layers, q = matmul_params(config)
    return float(sum(6 * n * s + 12 * layers * q * s * s for s in lengths))


def split(tokens: int, seq_tokens: int) -> list[int]:
    lengths = [seq_tokens] * (tokens // seq_tokens)
    if tokens % seq_tokens:
        lengths.append(tokens % seq_tokens)
    return lengths


def timed_ms(fn: Any, device: torch.device, *, warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        fn()
    return repeat_ms(fn, device, repeats=repeats)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-config", default=str(ROOT / "examples" / "models" / "qwen2.5-0.5b.json"))
    p.add_argument("--layers", type=int, default=None, help="keep the first N decoder layers (default: all)")
    p.add_argument("--tokens", default="1024,4096,16384", help="tokens per microbatch, comma-separated")
    p.add_argument("--seq-tokens", type=int, default=1024, help="tokens per packed sequence (default 1024)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default=None, help="bfloat16 on cuda, float32 on cpu by default")
    p.add_argument("--loss-chunk-tokens", type=int, default=4096)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--modes", default="eager,compiled,fullgraph,stack", help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--peak-tflops", type=float, default=GPUS["h100-80g"].peak_bf16_tflops)
    p.add_argument("--name", default=None, help="the shape's name in the report (default: the config's file name)")
    p.add_argument("--out", default=None, help="write the Markdown table here")
    p.add_argument("--json", default=None, help="write the rows as JSON here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench/fast_step.py: --device cuda but torch sees no CUDA GPU; nothing was measured", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    config = dict(read_model_config(args.model_config))
    if args.layers is not None:
        config["num_hidden_layers"] = min(args.layers, int(config["num_hidden_layers"]))
    name = args.name or Path(args.model_config).stem
    choice = kernel_choice(device, dtype)
    print(choice.describe(), flush=True)
    vocab = int(config["vocab_size"])
    rows: list[dict[str, Any]] = []
    token_counts = [int(t) for t in args.tokens.split(",") if t]
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise SystemExit(f"--modes: unknown mode {unknown[0]!r} ({', '.join(MODES)})")
    model: Any = None
    if device.type != "cuda" and "cudagraphs" in modes:
        print("bench/fast_step.py: cudagraphs needs CUDA; that mode is skipped", file=sys.stderr)
        modes.remove("cudagraphs")
    for mode in modes:
        model = None  # each mode on a fresh model with the same weights (seed 0): a layer compiles one way
        if device.type == "cuda":
            torch.cuda.empty_cache()
        model = build_model(config, seed=0, device=device, dtype=dtype)
        if MODES[mode] is not None:
            compile_model(model, compile=MODES[mode], device=device)
        graphs = mode == "cudagraphs"
        for tokens in token_counts:
            lengths = split(tokens, args.seq_tokens)
            data = SyntheticData(seed=tokens, lengths=tuple(lengths))
            layout = MicrobatchLayout(
                step=0, ranks=(0,), position=0, local_ids=tuple(range(len(lengths))), local_lengths=tuple(lengths),
                sharded=(),
            )  # fmt: skip
            mb = ready_microbatch(layout, lambda i, d=data: d.lm_tokens(i, vocab), loss_normalizer=0, device=device)
            plan = DACPPlan.build(layout, group=None, kernel=choice.kernel, device=device)
            kwargs, labels = model_inputs(mb, plan)
            num_targets = int((labels != -100).sum())

            def step(
                kwargs: dict[str, Any] = kwargs,
                labels: torch.Tensor = labels,
                n: int = num_targets,
                m: Any = model,
                graphs: bool = graphs,
            ) -> None:
                if graphs:  # a new step: the previous replay's outputs may be overwritten
                    torch.compiler.cudagraph_mark_step_begin()  # type: ignore[no-untyped-call]
                loss = causal_lm_loss(m, kwargs, labels, num_targets=n, loss_chunk_tokens=args.loss_chunk_tokens)
                loss.backward()
                for p in m.parameters():
                    p.grad = None

            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            before = compile_count()
            t0 = time.perf_counter()
            step()  # the first run: compiles (compiled mode), allocates
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            first_s = time.perf_counter() - t0
            times = timed_ms(step, device, warmup=max(0, args.warmup - 1), repeats=args.repeats)
            ms = statistics.median(times)
            flops = model_flops(config, lengths)
            peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
            rows.append(
                {
                    "model": name,
                    "layers": config["num_hidden_layers"],
                    "mode": mode,
                    "tokens": tokens,
                    "sequences": len(lengths),
                    "ms": ms,
                    "ms_min": min(times),
                    "ms_max": max(times),
                    "tokens_per_s": tokens / (ms / 1e3),
                    "mfu": flops / (ms / 1e3) / (args.peak_tflops * 1e12),
                    "first_run_s": first_s,
                    "compiles": compile_count() - before,
                    "peak_gib": peak,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    text = report(rows, args=args, choice_line=choice.describe(), config=config, device=device, dtype=dtype)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0


def report(
    rows: list[dict[str, Any]],
    *,
    args: argparse.Namespace,
    choice_line: str,
    config: dict[str, Any],
    device: torch.device,
    dtype: torch.dtype,
) -> str:
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    lines = [
        f"# Eager vs compiled step: {rows[0]['model'] if rows else '-'} (bench/fast_step.py)",
        "",
        f"{date}; {where}; torch {torch.__version__}; {str(dtype).removeprefix('torch.')}; {choice_line}.",
        f"{config['num_hidden_layers']} decoder layers, hidden {config['hidden_size']}, vocab {config['vocab_size']}; "
        f"packed sequences of {args.seq_tokens} tokens; fused LM-head loss in chunks of {args.loss_chunk_tokens}; "
        f"median of {args.repeats} runs after {args.warmup} warm-up run(s); MFU: 6N + 12Lq*S FLOPs per token "
        f"over {args.peak_tflops:.0f} TFLOP/s.",
        "",
        "| tokens | mode | ms (median) | min-max ms | tokens/s | MFU | speedup vs eager | first run s | compiles "
        "| peak GiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    eager = {r["tokens"]: r["ms"] for r in rows if r["mode"] == "eager"}
    for r in sorted(rows, key=lambda r: (r["tokens"], r["mode"] != "eager")):
        ref = eager.get(r["tokens"])
        speedup = f"{ref / r['ms']:.2f}x" if ref else "-"
        lines.append(
            f"| {r['tokens']} | {r['mode']} | {r['ms']:.1f} | {r['ms_min']:.1f}-{r['ms_max']:.1f} "
            f"| {r['tokens_per_s']:.0f} | {100 * r['mfu']:.1f}% | {speedup} | {r['first_run_s']:.1f} "
            f"| {r['compiles']} | {r['peak_gib']:.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

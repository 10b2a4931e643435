#!/usr/bin/env bash
# GPU acceptance (docs/gpu-check/README.md), one script for `make gpu-check` and for machines without the venv:
#
#   bench/gpu_check.sh OUT_DIR [MODEL ...]      (PYTHON=... picks the interpreter; default python3)
#
# Run it from the repository root with an interpreter that imports torch, transformers, accelerate, numpy
# and pytest, and skrull (the project's venv, or PYTHONPATH=$PWD; nothing else of the project's
# dependencies is needed on this path). It installs nothing and needs no network. flash-attn 4 is used when
# `flash_attn.cute` imports (put it on PYTHONPATH) and its trial call passes on this GPU.
#
# Without a CUDA GPU it says so in one line (stderr) and exits 0, writing nothing.
#
# Steps, in order of priority, each under its own time cap and all under one budget (GPU_CHECK_BUDGET_S,
# default 400 s: the whole script stays within 7 minutes); a step that fails or runs out of time is
# logged and the next one runs; the exit status is the first failure's:
#   device         OUT_DIR/device.txt: device, date, driver, versions, attention backend and why, launch rate
#   fast-step      eager vs compiled step (regional, one graph per layer, the stack one graph), tokens/s, MFU at 1,024,
#                  4,096, 16,384 tokens per microbatch
#                  (OUT_DIR/fast-step-MODEL.md; qwen2.5-7b: its first 4 layers at 7B dimensions)
#   profile/check  the profile measured on the fast step and its check (OUT_DIR/MODEL.profile.json, .check.md)
#   finetune-step  whole planned steps of the first MODEL on the bundled mooncake distribution: estimate vs
#                  measured for auto, skrull, packed, deepspeed, speedups over deepspeed (OUT_DIR/finetune-step.md)
#   calibration    skrull finetune --calibrate of the first MODEL from the bundled H100 profile: the summary line
#                  (OUT_DIR/calibration.txt) and the calibrated profile (OUT_DIR/MODEL.calibrated.json)
#   hf-trainer     SkrullTrainer vs the plain Trainer with DataCollatorWithFlattening (OUT_DIR/hf-trainer.md)
#   gpu-tests      pytest -m gpu (OUT_DIR/gpu-tests.txt)
# OUT_DIR/summary.md lists every step with its exit status and seconds.
#
# GPU_CHECK_CPU_SMOKE=1 runs every step on the CPU with tiny shapes (the same scripts and code paths),
# to check the script itself where there is no GPU. GPU_CHECK_ONLY=NAME[,NAME...] runs only those steps
# (names as in summary.md, e.g. calibration), under the same caps.
set -u
if [ $# -lt 1 ]; then
    echo "usage: bench/gpu_check.sh OUT_DIR [MODEL ...]  (from the repository root; PYTHON=... picks the interpreter)" >&2
    exit 2
fi
out=$1
shift
models=("${@:-qwen2.5-0.5b}")
py=${PYTHON:-python3}
smoke=${GPU_CHECK_CPU_SMOKE:-0}
budget=${GPU_CHECK_BUDGET_S:-400}
only=${GPU_CHECK_ONLY:-}  # comma-separated step names: run those alone (e.g. calibration)
if [ "${GPU_CHECK_CPU_SMOKE:-0}" = 1 ]; then budget=${GPU_CHECK_BUDGET_S:-3600}; fi
status=0
started=$SECONDS

"$py" -c 'import torch' 2>/dev/null || { echo "gpu-check: $py cannot import torch; set PYTHON to an interpreter with torch (make gpu-check uses the project's venv)" >&2; exit 2; }
if [ "$smoke" != 1 ]; then
    "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null || {
        echo "gpu-check: needs a CUDA GPU and torch sees none (torch.cuda.is_available() is False); nothing was run or written" >&2
        exit 0
    }
fi
mkdir -p "$out"
printf '| step | exit | seconds | cap s |\n|---|---|---|---|\n' >"$out/summary.md"

step() {  # step NAME CAP_S CMD...: run under min(CAP_S, budget left), log to OUT_DIR/NAME.log
    local name=$1 cap=$2
    shift 2
    if [ -n "$only" ] && [[ ",$only," != *",$name,"* ]]; then return; fi
    if [ "$smoke" = 1 ]; then cap=$((cap * 6)); fi  # a shared CPU compiles far slower than a GPU host
    local left=$((budget - (SECONDS - started)))
    if [ "$left" -lt "$cap" ]; then cap=$left; fi
    if [ "$cap" -lt 15 ]; then
        echo "== $name: skipped, the budget of $budget s is spent"
        echo "| $name | skipped (budget) | 0 | 0 |" >>"$out/summary.md"
        if [ "$status" -eq 0 ]; then status=124; fi
        return
    fi
    echo "== $name (cap ${cap} s): $*"
    local start=$SECONDS
    timeout -k 10 "$cap" "$@" 2>&1 | tee "$out/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $((SECONDS - start)) s"
    echo "| $name | $rc$([ "$rc" -eq 124 ] && echo ' (time cap)') | $((SECONDS - start)) | $cap |" >>"$out/summary.md"
    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
}

# model name -> (config for the step benches, layers kept, profiler shape); the smoke run uses tiny ones
config_of() {
    if [ "$smoke" = 1 ]; then
        case $1 in *7b*) echo "examples/models/llama-tiny.json" ;; *) echo "examples/models/qwen2-tiny.json" ;; esac
    else
        echo "examples/models/$1.json"
    fi
}
layers_of() { case $1 in *7b*) echo 4 ;; *) echo 1000 ;; esac; }
if [ "$smoke" = 1 ]; then
    device=cpu tokens=96,200 seq_tokens=64 chunk=64 prof_model=tiny
    prof_args=(--device cpu --max-tokens 256 --repeats 1 --compile on)
    check_args=(--device cpu --repeats 1 --cp 2 --per-rank 4 --bucket-tokens 256 --compile on)
    ft_args=(--device cpu --per-rank 4 --batches 1 --max-tokens 200 --bucket-tokens 256 --loss-chunk-tokens 64)
    hf_args=(--device cpu --max-tokens 100 --global-batch-size 4 --steps 2 --warmup 1 --compile on --bucket-tokens 256)
    calib_shape=(8 3 200 256)  # sequences per batch, global batches, longest sequence, bucket tokens
    calib_args=(--backend gloo --dtype float32 --steps 6)
else
    device=cuda tokens=1024,4096,16384 seq_tokens=1024 chunk=4096 prof_model=
    prof_args=(--device cuda --max-tokens 16384 --repeats 3)
    check_args=(--device cuda --repeats 2 --dataset chatqa2-long-sft --cp 4 --per-rank 8)
    ft_args=(--device cuda --per-rank 8 --batches 2)
    hf_args=(--device cuda --steps 4 --warmup 2)
    calib_shape=(16 4 16384 16384)
    calib_args=(--backend nccl --dtype bfloat16 --loss-chunk-tokens 4096 --steps 8 --warmup 4)  # warm-up: one pass compiles every shape range
fi

step device 30 "$py" - "$device" "$out/device.txt" <<'EOF'
import datetime, platform, subprocess, sys, time
import torch
device = torch.device(sys.argv[1])
lines = [f"date: {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}"]
if device.type == "cuda":
    p = torch.cuda.get_device_properties(0)
    lines.append(f"device: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}, {p.total_memory / 2**30:.1f} GiB, "
                 f"{p.multi_processor_count} SMs, sm{p.major}{p.minor}")
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except Exception as exc:  # no nvidia-smi: say so
        driver = f"unknown ({type(exc).__name__})"
    lines.append(f"driver: {driver}")
else:
    lines.append(f"device: cpu {platform.machine()} (GPU_CHECK_CPU_SMOKE: a smoke run, no figure here is a GPU's)")
import transformers
lines.append(f"torch {torch.__version__}, CUDA {torch.version.cuda}, transformers {transformers.__version__}, "
             f"Python {platform.python_version()}")
from skrull.worker.kernels import kernel_choice
dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
lines.append(kernel_choice(device, dtype).describe())
if device.type == "cuda":  # how fast the host issues kernels: small eager ops are launch-bound below this rate
    a = torch.ones(16, device="cuda")
    for _ in range(200):
        a.add_(1.0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(2000):
        a.add_(1.0)
    torch.cuda.synchronize()
    lines.append(f"host launch rate: {(time.perf_counter() - t0) / 2000 * 1e6:.1f} us per eager op (16-element add_)")
text = "\n".join(lines)
print(text)
open(sys.argv[2], "w").write(text + "\n")
EOF

for model in "${models[@]}"; do
    # measured on one H100 (docs/gpu-check/2026-11-26/summary.md): 45 s for the 0.5B shape, eager and regional;
    # each one-graph mode (fullgraph, stack: a model and a compile each) adds about half of that
    cap=110
    case $model in *7b*) cap=120 ;; esac
    step "fast-step-$model" "$cap" "$py" bench/fast_step.py --model-config "$(config_of "$model")" --name "$model" \
        --layers "$(layers_of "$model")" --device "$device" --tokens "$tokens" --seq-tokens "$seq_tokens" \
        --loss-chunk-tokens "$chunk" --warmup 2 --repeats 3 --out "$out/fast-step-$model.md"
done

profile_and_check() {  # the profile measured on the fast step, then its check (median error <= 15%)
    local model=$1 shape=${prof_model:-$1}
    step "$model.profile" 50 "$py" -m skrull.cli.main profile --model "$shape" "${prof_args[@]}" \
        --output "$out/$model.profile.json"
    step "$model.check" 40 "$py" -m skrull.cli.main profile --check "$out/$model.profile.json" \
        --max-median-error 0.15 "${check_args[@]}"
    [ -f "$out/$model.check.log" ] && cp "$out/$model.check.log" "$out/$model.check.md"
}
first=${models[0]}
profile_and_check "$first"

# whole planned steps on the bundled mooncake lengths, estimated from the profile just measured (the bundled
# derived one if the measurement failed: the table names the profile it used)
profile="$out/$first.profile.json"
if [ ! -f "$profile" ]; then profile="h100-80g/qwen2.5-0.5b"; echo "== finetune-step: no measured profile, estimates from $profile"; fi
step finetune-step 130 "$py" bench/finetune_step.py --model-config "$(config_of "$first")" \
    --profile "$profile" --datasets mooncake --solvers auto,skrull,packed,deepspeed \
    "${ft_args[@]}" --out "$out/finetune-step.md"

# calibration of the planner against measured microbatch times: the first MODEL trained under plans from the
# bundled H100 profile, refitted after every step (skrull finetune --calibrate); the one-line summary goes to
# OUT_DIR/calibration.txt, the calibrated profile to OUT_DIR/MODEL.calibrated.json (docs/profiles.md)
calib_request="$out/calibration-request.json"
"$py" - "$calib_request" "h100-80g/$first" "${calib_shape[@]}" <<'EOF' || echo "== calibration: no request written"
import json, sys
from skrull.solver.lengths.datasets import synthesize_request
from skrull.solver.io import request_to_dict
from skrull.solver.profile import load_profile
from skrull.solver.types import Parallel
path, start, per_rank, batches, max_tokens, bucket = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
request = synthesize_request(dataset="mooncake", parallel=Parallel(dp=1, cp=1), profile=load_profile(start),
                             sequences_per_rank=per_rank, num_batches=batches, seed=0, solver="auto",
                             bucket_tokens=bucket, max_tokens=max_tokens)
doc = {**request_to_dict(request), "time_budget_s": 0.2, "deterministic": True}
open(path, "w").write(json.dumps(doc) + "\n")
print(f"calibration request: {batches} global batches of {per_rank} mooncake lengths <= {max_tokens} tokens, from {start}")
EOF
step calibration 150 "$py" -m skrull.cli.main finetune --model-config "$(config_of "$first")" --request "$calib_request" \
    --world-size 1 "${calib_args[@]}" --calibrate --calibrated-profile-out "$out/$first.calibrated.json"
[ -f "$out/calibration.log" ] && grep '^calibration: ' "$out/calibration.log" | tail -n 1 >"$out/calibration.txt"

# the Hugging Face Trainer under plans against the plain Trainer with DataCollatorWithFlattening
step hf-trainer 65 "$py" -m torch.distributed.run --standalone --nproc-per-node 1 bench/hf_trainer_step.py \
    --model-config "$(config_of "$first")" "${hf_args[@]}" --out "$out/hf-trainer.md"

for model in "${models[@]:1}"; do
    profile_and_check "$model"
done

if [ "$smoke" != 1 ]; then
    gpu_tests=$(grep -rl --include='*.py' 'mark.gpu' tests | sort)
    # shellcheck disable=SC2086  # one path per word
    # -x --tb=short: a failure's reason is in the log even when the cap ends the run after it
    step gpu-tests 60 "$py" -m pytest -q -x --tb=short -rf -p no:cacheprovider -m gpu $gpu_tests
    [ -f "$out/gpu-tests.log" ] && cp "$out/gpu-tests.log" "$out/gpu-tests.txt"
fi
echo "gpu-check: $((SECONDS - started)) s in all (budget $budget s); exit $status; $out/summary.md"
cat "$out/summary.md"
exit $status

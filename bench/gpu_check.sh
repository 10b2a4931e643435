#!/usr/bin/env bash
# GPU acceptance (docs/finetune.md), one script for `make gpu-check` and for machines without the venv:
#
#   bench/gpu_check.sh OUT_DIR [MODEL ...]      (PYTHON=... picks the interpreter; default python3)
#
# Run it from the repository root with an interpreter that can import torch, pytest, transformers and
# skrull (the project's venv, or PYTHONPATH=$PWD with those installed); it installs nothing.
#
# For each model shape (default qwen2.5-0.5b): the GPU tests once, a measured profile
# (OUT_DIR/<model>.profile.json), its predictions checked against measured per-rank compute
# (OUT_DIR/<model>.check.md, median relative error <= 15%), then a measured training step per planner
# (OUT_DIR/finetune-step.md; FINETUNE_ARGS adds arguments of bench/finetune_step.py). Every step runs even when an earlier one fails; the exit status is the
# first failure's. The device, torch and the attention kernel go to OUT_DIR/device.txt.
set -u
if [ $# -lt 1 ]; then
    echo "usage: bench/gpu_check.sh OUT_DIR [MODEL ...]  (from the repository root; PYTHON=... picks the interpreter)" >&2
    exit 2
fi
out=$1
shift
models=("${@:-qwen2.5-0.5b}")
py=${PYTHON:-python3}
status=0
step() {  # step NAME CMD...: run, log to OUT_DIR/NAME.log, remember the first failure
    local name=$1
    shift
    echo "== $name: $*"
    local start=$SECONDS
    "$@" 2>&1 | tee "$out/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $((SECONDS - start)) s"
    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
}

"$py" -c 'import torch' 2>/dev/null || { echo "gpu-check: $py cannot import torch; set PYTHON to an interpreter with torch (make gpu-check uses the project's venv)" >&2; exit 2; }
"$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "gpu-check: needs a CUDA GPU and torch sees none (torch.cuda.is_available() is False); nothing was run")' || exit 2
mkdir -p "$out"
"$py" - >"$out/device.txt" <<'EOF'
import platform, torch
from skrull.worker.kernels import select_kernel
p = torch.cuda.get_device_properties(0)
print(f"device: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}, {p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} SMs")
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, Python {platform.python_version()}")
print(f"attention kernel (bf16): {select_kernel(torch.device('cuda'), torch.bfloat16).name}")
# how fast the host issues kernels: small eager ops are launch-bound below this rate
import time
a = torch.ones(16, device="cuda")
for _ in range(200):
    a.add_(1.0)
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(2000):
    a.add_(1.0)
torch.cuda.synchronize()
print(f"host launch rate: {(time.perf_counter() - t0) / 2000 * 1e6:.1f} us per eager op (16-element add_)")
EOF
cat "$out/device.txt"
gpus=$("$py" -c 'import torch; print(torch.cuda.device_count())')
gpu_tests=$(grep -rl --include='*.py' 'mark.gpu' tests | sort)
# shellcheck disable=SC2086  # one path per word
step gpu-tests "$py" -m pytest -q -p no:cacheprovider -m gpu $gpu_tests
for model in "${models[@]}"; do
    step "$model.profile" "$py" -m skrull.cli.main profile --model "$model" --gpus "$gpus" --output "$out/$model.profile.json"
    step "$model.check" "$py" -m skrull.cli.main profile --check "$out/$model.profile.json" --max-median-error 0.15
    cp "$out/$model.check.log" "$out/$model.check.md"
done
# shellcheck disable=SC2086  # FINETUNE_ARGS is split into arguments on purpose
step finetune-step "$py" bench/finetune_step.py --profile "$out/${models[0]}.profile.json" --out "$out/finetune-step.md" ${FINETUNE_ARGS:-}
exit $status
